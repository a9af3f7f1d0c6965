from __future__ import annotations

import json

import pytest
from pydantic import SecretStr

from corral import ConfigError, ExecutionPlan, Resources
from corral.core.plan import FallbackImageRecipe, RecipeRegistry


@pytest.mark.parametrize(
    ("fields", "winner"),
    [
        (
            {"native": {"build": "."}, "image": "a", "task_image": "b", "fallback_image": "c"},
            "native",
        ),
        ({"image": "a", "task_image": "b", "fallback_image": "c"}, "image"),
        ({"task_image": "b", "fallback_image": "c"}, "task_image"),
        ({"fallback_image": "c"}, "fallback_image"),
    ],
)
def test_image_priority(fields: dict[str, object], winner: str) -> None:
    plan = ExecutionPlan.model_validate(fields)
    assert plan.image_source() == winner
    resolved = plan.resolved()
    assert resolved.image_source() == winner
    assert getattr(resolved, winner) == fields[winner]
    for other in ("native", "image", "task_image", "fallback_image"):
        if other != winner:
            assert getattr(resolved, other) is None


def test_require_image_names_the_fields() -> None:
    with pytest.raises(ConfigError, match="native, image, task_image or fallback_image"):
        ExecutionPlan().require_image("docker")


def test_resources_merge_field_by_field() -> None:
    plan = ExecutionPlan(
        resources=Resources(cpu=2, gpus=0),
        task_resources=Resources(cpu=8, memory_mb=4096, gpus=1),
    )
    merged = plan.resolved().resources
    assert (merged.cpu, merged.memory_mb, merged.gpus, merged.disk_mb) == (2, 4096, 0, None)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"image": "has space"}, "has space"),
        ({"workdir": "relative/dir"}, "relative/dir"),
        ({"env": {"A=B": "x"}}, "A=B"),
        ({"resources": {"cpu": -1}}, "cpu"),
        ({"resources": {"memory": 5}}, "memory"),
        ({"imgae": "x"}, "imgae"),
        ({"network": "allowlist:http://x"}, "http://x"),
    ],
)
def test_bad_plans_name_the_value(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ExecutionPlan.model_validate(fields)


def test_secrets_never_in_repr_or_persisted_plan() -> None:
    plan = ExecutionPlan(image="x", env={"TOKEN": SecretStr("hunter2"), "PLAIN": "visible"})
    assert "hunter2" not in repr(plan)
    assert "hunter2" not in json.dumps(plan.persisted())
    assert plan.persisted()["env"]["PLAIN"] == "visible"


def test_recipes_write_fallback_only_and_never_twice() -> None:
    registry = RecipeRegistry(
        [FallbackImageRecipe(id="swe", benchmark="swe-bench", fallback_image="swe:latest")]
    )
    plan = ExecutionPlan(benchmark="swe-bench", image="explicit:1")
    applied = registry.apply(plan, "docker")
    assert applied.fallback_image == "swe:latest"
    assert applied.resolved().image == "explicit:1"  # an explicit image still wins
    assert registry.apply(ExecutionPlan(benchmark="other"), "docker").fallback_image is None
    registry.register(
        FallbackImageRecipe(
            id="swe-k8s", benchmark="swe-bench", fallback_image="k", providers=frozenset({"docker"})
        )
    )
    with pytest.raises(ConfigError, match="swe, swe-k8s"):
        registry.apply(plan, "docker")
    assert registry.apply(plan, "k8s").fallback_image == "swe:latest"
    with pytest.raises(ConfigError, match="'swe'"):
        registry.register(FallbackImageRecipe(id="swe", benchmark="b", fallback_image="i"))
