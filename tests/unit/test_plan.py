from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from pydantic import BaseModel, SecretStr

from corral import ConfigError, ExecutionPlan, NetworkSchedule, Resources
from corral.core import plan as plan_module
from corral.core.plan import FallbackImageRecipe, RecipeRegistry
from corral.core.redact import MASK, plain_env, redact, secret_values


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


KEY = "sk-proj-4f9c2e7a1b"

CREDENTIAL_NAMES = [
    "OPENAI_API_KEY",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "GITHUB_TOKEN",
    "PGPASSWORD",
    "REDIS_PASSWD",
    "DB_PASS",
    "MYSQL_PWD",
    "SENTRY_DSN",
    "NPM_AUTH",
    "HTTP_COOKIE",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "SSH_PRIVATE_KEY_FILE",
    "apiKey",
    "my-secret",
    "Authorization",
]


def _every_view(plan: ExecutionPlan) -> dict[str, str]:
    return {
        "repr": repr(plan),
        "str": str(plan),
        "persisted": json.dumps(plan.persisted()),
        "json": plan.model_dump_json(),
        "dump": repr(plan.model_dump()),
        "env repr": repr(plan.env),
    }


@pytest.mark.parametrize("name", CREDENTIAL_NAMES)
def test_env_values_of_credential_names_are_masked_everywhere(name: str) -> None:
    plan = ExecutionPlan(image="x", env={name: KEY, "LANG": "C.UTF-8"})
    shown = {view: text for view, text in _every_view(plan).items() if KEY in text}
    assert shown == {}, f"{name}'s value shows in {sorted(shown)}"
    assert isinstance(plan.env[name], SecretStr)
    assert plain_env(plan.env) == {name: KEY, "LANG": "C.UTF-8"}, "the sandbox gets the value"
    assert plan.persisted()["env"]["LANG"] == "C.UTF-8"


@pytest.mark.parametrize("name", ["HOME", "PATH", "LANG", "GIT_AUTHOR_NAME", "PYTHONPATH"])
def test_other_env_values_stay_plain(name: str) -> None:
    plan = ExecutionPlan(env={name: "v"})
    assert plan.env[name] == "v"
    assert f"'{name}': 'v'" in repr(plan)


def test_public_env_names_turn_the_mask_off_per_name() -> None:
    plan = ExecutionPlan(
        env={"SSH_KEY_PATH": "/keys/id", "OPENAI_API_KEY": KEY},
        public_env_names=frozenset({"SSH_KEY_PATH"}),
    )
    assert plan.env["SSH_KEY_PATH"] == "/keys/id"
    assert "/keys/id" in repr(plan)
    assert isinstance(plan.env["OPENAI_API_KEY"], SecretStr)
    # An explicit SecretStr stays one, public or not.
    explicit = ExecutionPlan(
        env={"A_TOKEN": SecretStr(KEY)}, public_env_names=frozenset({"A_TOKEN"})
    )
    assert KEY not in repr(explicit)


def test_derived_plans_are_masked_too() -> None:
    plan = ExecutionPlan(image="x").model_copy(update={"env": {"HF_TOKEN": KEY}})
    assert KEY not in repr(plan)
    assert KEY not in plan.resolved().model_dump_json()
    assert secret_values(plan.env) == [KEY]


def test_a_derived_plan_is_validated_as_a_new_one_would_be() -> None:
    # model_copy used to set fields unchecked: a policy string stayed a string and failed
    # deep inside open() (AttributeError), an unknown field was silently kept.
    plan = ExecutionPlan(image="x", workdir="/w", network="no-network")
    derived = plan.model_copy(update={"network": "public"})
    assert derived.network == NetworkSchedule(baseline="public")
    assert (derived.image, derived.workdir) == ("x", "/w")
    assert derived.model_fields_set == {"image", "workdir", "network"}
    with pytest.raises(ValueError, match="workdir"):
        plan.model_copy(update={"workdir": "relative"})
    with pytest.raises(ValueError, match="networks"):
        plan.model_copy(update={"networks": "public"})
    deep = plan.model_copy(update={"labels": {"a": "b"}}, deep=True)
    assert deep.labels == {"a": "b"} and plan.labels == {}


def test_error_text_is_redacted_and_validation_errors_show_no_env() -> None:
    plan = ExecutionPlan(env={"OPENAI_API_KEY": KEY, "USER": "corral"})
    assert redact(f"401 for key {KEY} as corral", secret_values(plan.env)) == (
        f"401 for key {MASK} as corral"
    )
    for bad in ({"A=B": "x", "OPENAI_API_KEY": KEY}, {"OPENAI_API_KEY": [KEY]}):
        with pytest.raises(ValueError) as info:
            ExecutionPlan.model_validate({"env": bad})
        assert KEY not in str(info.value)
    with pytest.raises(ValueError, match="workdir") as info:
        ExecutionPlan.model_validate({"env": {"OPENAI_API_KEY": KEY}, "workdir": "rel"})
    assert KEY not in str(info.value)


class _HoldsAPlan(BaseModel):
    plan: ExecutionPlan


def test_models_holding_a_plan_show_no_env_value_in_errors() -> None:
    with pytest.raises(ValueError, match="A=B") as info:
        _HoldsAPlan.model_validate({"plan": {"env": {"A=B": "x", "OPENAI_API_KEY": KEY}}})
    assert KEY not in str(info.value)


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


def test_the_typed_signature_names_every_field() -> None:
    # ExecutionPlan's TYPE_CHECKING __init__ (what pyright sees) lists every field.
    source = Path(plan_module.__file__).read_text()
    tree = ast.parse(source)
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ExecutionPlan"]
    inits = [n for n in ast.walk(cls) if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    assert len(inits) == 1
    assert [a.arg for a in inits[0].args.kwonlyargs] == list(ExecutionPlan.model_fields)
