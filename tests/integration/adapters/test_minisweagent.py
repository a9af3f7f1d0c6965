"""mini-swe-agent's own agent loop (`DefaultAgent`, with its `default.yaml` config) and its
deterministic test model (`DeterministicModel`) run to completion in a corral Docker
sandbox through `corral.adapters.minisweagent.CorralEnvironment`: built by mini-swe-agent's
`get_environment` from a config, and on a session of a `TaskRun`."""

from __future__ import annotations

from typing import Any, Protocol

import anyio
import pytest
import yaml
from minisweagent import package_dir
from minisweagent.agents.default import DefaultAgent
from minisweagent.environments import (
    get_environment,  # pyright: ignore[reportUnknownVariableType]  # its config dict is untyped
)
from minisweagent.models.test_models import (
    DeterministicModel,
    make_output,  # pyright: ignore[reportUnknownVariableType]  # its actions are untyped dicts
)

from corral import ExecutionPlan, NetworkSchedule, TaskRun
from corral.adapters.minisweagent import CorralEnvironment
from corral.providers.docker.session import DockerSession
from tests.integration.adapters.inspect_configs import DOCKER
from tests.integration.docker.conftest import TEST_IMAGE, leftovers, make_env

pytestmark = pytest.mark.docker

TASK = "Write the sum of 19 and 23 to answer.txt, then submit it."


class Agent(Protocol):
    """What the tests read of mini-swe-agent's agent (whose dicts are untyped)."""

    messages: list[dict[str, Any]]

    def run(self, task: str = "") -> dict[str, Any]: ...


def _agent(model: DeterministicModel, environment: CorralEnvironment) -> Agent:
    return DefaultAgent(model, environment, **_agent_config())


def _observations(agent: Agent) -> list[str]:
    """What the environment said back, one per action (the first user message is the task)."""
    return [m["content"] for m in agent.messages if m["role"] == "user"][1:]


def _agent_config() -> dict[str, Any]:
    """The agent section of mini-swe-agent's own default config."""
    config: dict[str, Any] = yaml.safe_load((package_dir / "config" / "default.yaml").read_text())
    return config["agent"]


def _model(*commands: str) -> DeterministicModel:
    return DeterministicModel(
        outputs=[make_output(f"step {n}", [{"command": c}]) for n, c in enumerate(commands)]
    )


def test_the_agent_solves_a_task_in_a_corral_sandbox(engine: Any, owner: str) -> None:
    environment = get_environment(
        {
            "environment_class": "corral.adapters.minisweagent.CorralEnvironment",
            "provider": "docker",
            "provider_config": {**DOCKER, "owner": owner, "user": "corral"},
            "plan": {"image": TEST_IMAGE, "workdir": "/home/corral"},
            "env": {"PAGER": "cat"},
            "timeout": 2,
        }
    )
    assert isinstance(environment, CorralEnvironment)
    try:
        model = _model(
            "echo $((19 + 23)) > answer.txt",
            "cat answer.txt; echo to stderr >&2; pwd; whoami; echo $PAGER",
            "sleep 30",
            "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat answer.txt",
        )
        agent = _agent(model, environment)
        result = agent.run(TASK)
        session = environment.session
        assert isinstance(session, DockerSession)
        inside = engine.containers.get(session.sandbox).exec_run(["cat", "/home/corral/answer.txt"])
        serialized = environment.serialize()["info"]["config"]
    finally:
        environment.cleanup()
    environment.cleanup()  # idempotent
    assert result == {"exit_status": "Submitted", "submission": "42\n"}
    assert inside.output == b"42\n"
    observations = _observations(agent)
    assert "<returncode>0</returncode>" in observations[1]
    assert "42\nto stderr\n/home/corral\ncorral\ncat\n" in observations[1]
    assert "<returncode>-1</returncode>" in observations[2]
    assert "Command 'sleep 30' timed out after 2 seconds" in observations[2]
    assert agent.messages[-1]["extra"]["exit_status"] == "Submitted"
    assert (
        serialized["environment_type"]
        == "corral.adapters.minisweagent.environment.CorralEnvironment"
    )
    assert serialized["environment"]["provider_config"]["owner"] == owner
    assert leftovers(engine, owner) == []


@pytest.mark.anyio
async def test_the_agent_runs_on_a_task_run_session(engine: Any, owner: str) -> None:
    plan = ExecutionPlan(image=TEST_IMAGE, network=NetworkSchedule(run="no-network"))
    async with TaskRun(make_env(owner), plan) as run, run.running():
        environment = CorralEnvironment(session=run.session, cwd="/tmp")
        model = _model(
            "uname -s; pwd",
            "echo $((6 * 7))",
            "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; echo done",
        )
        agent = _agent(model, environment)
        result = await anyio.to_thread.run_sync(agent.run, TASK)
        assert environment.get_template_vars()["system"] == "Linux"
        environment.cleanup()  # the session is the TaskRun's: it stays open
        assert not run.session.closed
        assert run.session.policy.network_mode == "no-network"  # the agent ran in the run phase
    assert result == {"exit_status": "Submitted", "submission": "done\n"}
    observations = _observations(agent)
    assert "Linux\n/tmp\n" in observations[0]
    assert "<output>\n42\n</output>" in observations[1]
    assert leftovers(engine, owner) == []
