"""`plan_from_compose`: what a simple task's compose.yaml becomes, and what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from corral.compose import plan_from_compose
from corral.core.plan import ExecutionPlan, Healthcheck
from corral.errors import ConfigError
from corral.network.policy import NetworkPolicy, NetworkSchedule

TASK = """
services:
  default:
    image: corral.local/test:bookworm
    command: sleep infinity
    working_dir: /work
    environment:
      MODE: eval
      API_TOKEN: tok-123
  db:
    image: postgres:16
    command: ["postgres", "-c", "fsync=off"]
    environment: [POSTGRES_PASSWORD=pw-456, PORT=5432]
    healthcheck:
      test: ["CMD", "pg_isready", "-U", "postgres"]
      interval: 500ms
      timeout: 1m30s
      retries: 5
      start_period: 2s
  web:
    image: corral.local/test:bookworm
    healthcheck:
      test: curl -fsS localhost:8080
"""


def test_a_task_becomes_a_plan_with_services(tmp_path: Path) -> None:
    path = tmp_path / "compose.yaml"
    path.write_text(TASK)
    base = ExecutionPlan(network=NetworkSchedule(baseline=NetworkPolicy.no_network()))
    plan = plan_from_compose(path, base=base)
    assert plan.image == "corral.local/test:bookworm"
    assert plan.command == ["sleep", "infinity"]
    assert plan.workdir == "/work"
    assert plan.env["MODE"] == "eval" and isinstance(plan.env["API_TOKEN"], SecretStr)
    assert plan.network == base.network
    assert list(plan.services) == ["db", "web"]
    db = plan.services["db"]
    assert db.command == ["postgres", "-c", "fsync=off"]
    assert db.env["PORT"] == "5432" and isinstance(db.env["POSTGRES_PASSWORD"], SecretStr)
    assert db.healthcheck == Healthcheck(
        test=["pg_isready", "-U", "postgres"],
        interval_s=0.5,
        timeout_s=90.0,
        retries=5,
        start_period_s=2.0,
    )
    web = plan.services["web"].healthcheck
    assert web is not None and web.test == "curl -fsS localhost:8080"
    assert "pw-456" not in repr(plan) and "tok-123" not in str(plan.persisted())


def test_the_main_service_is_chosen_as_inspect_does() -> None:
    two = {"services": {"a": {"image": "x"}, "b": {"image": "y"}}}
    assert plan_from_compose(two).image == "x"
    assert plan_from_compose(two, main_service="b").image == "y"
    marked = {"services": {"a": {"image": "x"}, "b": {"image": "y", "x-default": True}}}
    assert plan_from_compose(marked).image == "y"
    named = {"services": {"a": {"image": "x"}, "default": {"image": "y"}}}
    assert plan_from_compose(named).image == "y"
    with pytest.raises(ConfigError, match="no service 'c'.*a, b"):
        plan_from_compose(two, main_service="c")


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"services": {"a": {"image": "x", "ports": ["80:80"]}}}, "service 'a' sets ports"),
        ({"services": {"a": {"build": "."}}}, "service 'a' sets build"),
        ({"services": {"a": {"image": "x", "network_mode": "none"}}}, "network_mode"),
        ({"services": {"a": {"image": "x", "cap_add": ["NET_ADMIN"]}}}, "cap_add"),
        ({"services": {"a": {"image": "x"}}, "networks": {}}, "top-level networks"),
        ({"services": {"a": {"image": "x"}, "b": {"command": "x"}}}, "'b' needs an `image`"),
        ({"services": {"a": {"image": "x", "environment": ["HOME"]}}}, "'HOME' has no value"),
        ({"services": {"a": {"image": "${IMG}"}}}, "interpolation.*IMG"),
        (
            {"services": {"a": {"image": "x"}, "b": {"image": "y", "healthcheck": {"test": 3}}}},
            "healthcheck test 3",
        ),
        (
            {
                "services": {
                    "a": {"image": "x"},
                    "b": {"image": "y", "healthcheck": {"test": "t", "interval": "5 s"}},
                }
            },
            "interval '5 s' is not a duration",
        ),
        ({"services": {"a": {"image": "x", "healthcheck": {"test": "t"}}}}, "main service 'a'"),
        (
            {"services": {"Bad_Name": {"image": "x"}, "a": {"image": "y", "x-default": True}}},
            "service name 'Bad_Name'",
        ),
        ({"services": {}}, "at least one service"),
    ],
)
def test_what_a_plan_cannot_carry_is_refused_by_name(
    document: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_from_compose(document)


def test_bad_yaml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "compose.yaml"
    path.write_text("services: [\n")
    with pytest.raises(ConfigError, match="compose.yaml: not valid YAML"):
        plan_from_compose(path)


def test_escaped_dollars_and_disabled_checks_are_kept() -> None:
    plan = plan_from_compose(
        {
            "services": {
                "a": {"image": "x", "command": "echo $$HOME"},
                "b": {"image": "y", "healthcheck": {"test": ["NONE"]}},
            }
        }
    )
    assert plan.command == ["echo", "$HOME"]
    assert plan.services["b"].healthcheck is None
