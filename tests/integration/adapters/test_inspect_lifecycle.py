"""The `corral` Inspect sandbox's lifecycle on a real engine: an eval, failed inits, cleanup."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from inspect_ai import Task, eval  # pyright: ignore[reportUnknownVariableType]
from inspect_ai.dataset import Sample
from inspect_ai.scorer import includes
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.util import (
    ExecRemoteAwaitableOptions,
    SandboxEnvironmentSpec,
    SandboxUnavailableError,
    sandbox,
)

from corral import ExecutionPlan, NetworkSchedule, ProviderError
from corral.adapters.inspect import CorralSandboxConfig, CorralSandboxEnvironment
from tests.integration.adapters.inspect_configs import DOCKER_NONROOT

pytestmark = pytest.mark.docker


def _owned(engine: Any, owner: str) -> list[str]:
    selector = {"label": f"corral.owner={owner}"}
    containers = engine.containers.list(all=True, filters=selector)
    networks = engine.networks.list(filters=selector)
    return [c.name for c in containers] + [n.name for n in networks]


@solver
def whoami() -> Solver:
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        result = await sandbox().exec(["whoami"])
        state.output.completion = result.stdout.strip()
        return state

    return solve


def scores_one(config: CorralSandboxConfig, solver: Solver, sample: Sample, log_dir: Path) -> None:
    """Inspect's eval of `sample` with `solver` in a corral sandbox scores 1 (`includes`)."""
    task = Task(
        dataset=[sample],
        solver=solver,
        scorer=includes(),
        sandbox=SandboxEnvironmentSpec("corral", config),
    )
    [log] = eval(task, model="mockllm/model", log_dir=str(log_dir), display="none")
    assert log.status == "success", log.error
    assert log.results is not None
    assert log.results.scores[0].metrics["accuracy"].value == 1.0


def test_an_eval_runs_in_a_corral_sandbox(engine: Any, owner: str, tmp_path: Path) -> None:
    sample = Sample(input="who runs here?", target="corral")
    scores_one(DOCKER_NONROOT.config(owner), whoami(), sample, tmp_path)
    assert _owned(engine, owner) == []


def test_a_sandbox_whose_command_ends_leaves_nothing(engine: Any, owner: str) -> None:
    # The sandbox starts (network, holder and container exist), then its command exits.
    # Open's check races the exit (the engine reports `true` as running for a few ms
    # after `start`), so either the init fails, or it returns a sandbox in which no
    # command runs once the exit is seen; both leave nothing behind.
    config = CorralSandboxConfig(
        provider_config={**DOCKER_NONROOT.provider_config, "owner": owner},
        plan=ExecutionPlan(image=DOCKER_NONROOT.plan.image, command=["true"]),
    )

    async def init() -> None:
        try:
            envs = await CorralSandboxEnvironment.sample_init("failing", config, {})
        except ProviderError as exc:
            assert "exited at once" in str(exc)
            return
        try:
            env = envs["default"].as_type(CorralSandboxEnvironment)
            sandboxes = {"label": [f"corral.owner={owner}", "corral.role=sandbox"]}
            for container in engine.containers.list(all=True, filters=sandboxes):
                container.wait(timeout=10, condition="not-running")
            with pytest.raises(SandboxUnavailableError, match="is gone|not running"):
                await env.exec(["true"])
        finally:
            await CorralSandboxEnvironment.sample_cleanup("failing", config, envs, False)

    anyio.run(init)
    assert _owned(engine, owner) == []


@pytest.mark.anyio
async def test_task_cleanup_closes_what_sample_cleanup_missed(engine: Any, owner: str) -> None:
    config = DOCKER_NONROOT.config(owner)
    await CorralSandboxEnvironment.sample_init("abandoned", config, {})
    assert _owned(engine, owner)
    await CorralSandboxEnvironment.task_cleanup("abandoned", config, True)
    assert _owned(engine, owner) == []


@pytest.mark.anyio
async def test_phase_switch_and_connection(engine: Any, owner: str) -> None:
    config = CorralSandboxConfig(
        provider_config={**DOCKER_NONROOT.provider_config, "owner": owner},
        plan=DOCKER_NONROOT.plan.model_copy(
            update={"network": NetworkSchedule.model_validate({"run": "no-network"})}
        ),
    )
    envs = await CorralSandboxEnvironment.sample_init("phases", config, {})
    env = envs["default"].as_type(CorralSandboxEnvironment)
    try:
        await env.set_phase("run")
        assert env.session.policy.network_mode.value == "no-network"
        attach = await env.connection(user="root")
        assert attach.container is not None
        assert attach.command.startswith("docker exec -it --user root ")
        assert engine.containers.get(attach.container).status == "running"
        # What the agent leaves running during `run` is gone before the grader's phase.
        await env.exec(["sh", "-c", "setsid nohup sleep 1000 >/dev/null 2>&1 &"])
        await env.set_phase("evaluation")
        table = await env.exec(["ps", "-eo", "args"])
        assert "sleep 1000" not in table.stdout, table.stdout
    finally:
        await CorralSandboxEnvironment.sample_cleanup("phases", config, envs, False)
    with pytest.raises(ConnectionError):
        await env.connection()


@pytest.mark.anyio
async def test_an_agents_key_is_withheld_and_its_base_url_routed(engine: Any, owner: str) -> None:
    """An agent that runs in the sandbox (exec and exec_remote alike) never gets the key
    its harness passes; its base URL is the route's, as corral gave it to the sandbox."""
    route: Any = {"upstream": "https://api.example.com/v1", "headers": {"X-Api-Key": "sk-real-key"}}
    config = CorralSandboxConfig(
        provider_config={**DOCKER_NONROOT.provider_config, "owner": owner},
        plan=ExecutionPlan(image=DOCKER_NONROOT.plan.image, credentials={"model": route}),
        credential_env={"OPENAI_BASE_URL": "model"},
        withhold_env=("OPENAI_API_KEY",),
    )
    given = {"OPENAI_API_KEY": "sk-real-key", "OPENAI_BASE_URL": "https://elsewhere"}
    script = 'echo "$OPENAI_API_KEY"; echo "$OPENAI_BASE_URL"; env | grep -c sk-real-key || true'
    envs = await CorralSandboxEnvironment.sample_init("routed", config, {})
    try:
        env = envs["default"].as_type(CorralSandboxEnvironment)
        seen = await env.exec(["sh", "-c", script], env=given)
        remote = await env.exec_remote(
            ["sh", "-c", script], ExecRemoteAwaitableOptions(env=given), stream=False
        )
        in_sandbox = await env.exec(["printenv", "CORRAL_CRED_MODEL_URL"])
    finally:
        await CorralSandboxEnvironment.sample_cleanup("routed", config, envs, False)
    for result in (seen, remote):
        key, url, count = result.stdout.split()
        assert key == "corral-credential-route" and count == "0", result
        assert url == in_sandbox.stdout.strip() and url.endswith("/model"), url
    assert _owned(engine, owner) == []


def test_a_routed_variable_must_name_a_route_of_the_plan(owner: str) -> None:
    with pytest.raises(ValueError, match="'OPENAI_BASE_URL' names route 'model'.*routes: none"):
        CorralSandboxConfig(
            plan=ExecutionPlan(image=DOCKER_NONROOT.plan.image),
            credential_env={"OPENAI_BASE_URL": "model"},
        )
