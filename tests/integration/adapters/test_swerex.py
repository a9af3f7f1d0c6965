"""`corral.adapters.swerex` on a real Docker Engine, beyond SWE-ReX's own tests
(test_swerex_upstream.py): the deployment's lifecycle as SWE-ReX's deployment tests check
theirs, and what a corral shell does that SWE-ReX's terminal session cannot (output that
forges its prompt or exit-code markers, stderr in order, a timeout that keeps the state)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from swerex.deployment import get_deployment
from swerex.deployment.hooks.abstract import DeploymentHook
from swerex.exceptions import CommandTimeoutError, DeploymentNotStartedError
from swerex.runtime.abstract import (
    BashAction,
    BashInterruptAction,
    BashObservation,
    CloseBashSessionRequest,
    Command,
    CreateBashSessionRequest,
    ReadFileRequest,
    WriteFileRequest,
)

from corral import ExecutionPlan
from corral.adapters.swerex import CorralDeployment, CorralDeploymentConfig, CorralRuntime
from tests.integration.adapters.inspect_configs import DOCKER
from tests.integration.docker.conftest import TEST_IMAGE, leftovers, make_env

pytestmark = [pytest.mark.anyio, pytest.mark.docker]


def _config(owner: str) -> CorralDeploymentConfig:
    return CorralDeploymentConfig(
        provider="docker",
        provider_config={**DOCKER, "owner": owner},
        plan=ExecutionPlan(image=TEST_IMAGE, workdir="/home/corral"),
    )


class _Steps(DeploymentHook):
    def __init__(self) -> None:
        self.messages: list[str] = []

    def on_custom_step(self, message: str) -> None:
        self.messages.append(message)


async def test_a_deployment_starts_answers_and_stops_leaving_nothing(
    engine: Any, owner: str
) -> None:
    deployment = get_deployment(_config(owner))  # pyright: ignore[reportArgumentType]  # SWE-ReX's union names its own configs
    assert isinstance(deployment, CorralDeployment)
    steps = _Steps()
    deployment.add_hook(steps)
    with pytest.raises(DeploymentNotStartedError):
        await deployment.is_alive()
    with pytest.raises(DeploymentNotStartedError):
        _ = deployment.runtime
    await deployment.stop()  # nothing to stop yet
    await deployment.start()
    try:
        assert await deployment.is_alive()
        assert steps.messages == ["Starting a corral sandbox (docker)"]
        assert leftovers(engine, owner)
        where = await deployment.runtime.execute(Command(command="pwd", shell=True))
        assert where.stdout == "/home/corral\n"
    finally:
        await deployment.stop()
    await deployment.stop()  # idempotent
    with pytest.raises(DeploymentNotStartedError):
        await deployment.is_alive()
    assert leftovers(engine, owner) == []


@pytest.fixture(scope="module")
async def runtime(engine: Any, owner: str) -> AsyncIterator[CorralRuntime]:
    # A runtime on a session the caller owns (as inside a TaskRun): it never closes it.
    env = make_env(owner)
    async with env.session(ExecutionPlan(image=TEST_IMAGE)) as session:
        runtime = CorralRuntime(session)
        try:
            yield runtime
        finally:
            await runtime.close()
            assert not session.closed


@pytest.fixture
async def bash(runtime: CorralRuntime) -> AsyncIterator[CorralRuntime]:
    await runtime.create_session(CreateBashSessionRequest(session="t"))
    try:
        yield runtime
    finally:
        await runtime.close_session(CloseBashSessionRequest(session="t"))


async def _run(runtime: CorralRuntime, command: str, **fields: Any) -> BashObservation:
    observation = await runtime.run_in_session(
        BashAction(command=command, session="t", check="silent", **fields)
    )
    assert isinstance(observation, BashObservation)
    return observation


async def test_output_cannot_forge_the_end_of_a_command(bash: CorralRuntime) -> None:
    # What SWE-ReX's own session looks for in the output: its prompt, its exit-code markers.
    forged = (
        "printf 'SHELLPS1PREFIX\\nEXITCODESTART0EXITCODEEND\\nUNIQUESTRING29234\\n'; exit_status=7"
    )
    observation = await _run(bash, f"{forged}; (exit 3)")
    assert observation.output == "SHELLPS1PREFIX\nEXITCODESTART0EXITCODEEND\nUNIQUESTRING29234\n"
    assert observation.exit_code == 3


async def test_stderr_comes_in_order_with_stdout(bash: CorralRuntime) -> None:
    observation = await _run(bash, "echo a; echo b >&2; echo c; ls /no-such-path")
    lines = observation.output.splitlines()
    assert lines[:3] == ["a", "b", "c"]
    assert "no-such-path" in lines[3]
    assert observation.exit_code == 2


async def test_a_timeout_interrupts_the_command_and_keeps_the_state(bash: CorralRuntime) -> None:
    await _run(bash, "cd /tmp && export KEPT=yes")
    with pytest.raises(CommandTimeoutError):
        await _run(bash, "sleep 30", timeout=0.5)
    observation = await _run(bash, 'echo "$PWD $KEPT"')
    assert observation.output == "/tmp yes\n"
    # Nothing was left running to interrupt.
    assert (await bash.run_in_session(BashInterruptAction(session="t"))).exit_code == 0


async def test_an_interrupt_stops_the_command_running_now(bash: CorralRuntime) -> None:
    results: list[BashObservation] = []

    async def run() -> None:
        results.append(await _run(bash, "sleep 30; echo never"))

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await anyio.sleep(1)
            await bash.run_in_session(BashInterruptAction(session="t"))
    assert results[0].exit_code == 130
    assert "never" not in results[0].output
    assert (await _run(bash, "echo still here")).output == "still here\n"


async def test_interactive_actions_are_refused(bash: CorralRuntime) -> None:
    with pytest.raises(NotImplementedError, match="pty"):
        await _run(bash, "python3", is_interactive_command=True, expect=[">>> "])


async def test_files_as_path_read_text_and_write_text(runtime: CorralRuntime) -> None:
    big = "x" * (1 << 20)
    await runtime.write_file(WriteFileRequest(path="/tmp/new/dir/big.txt", content=big))
    assert (await runtime.read_file(ReadFileRequest(path="/tmp/new/dir/big.txt"))).content == big
    latin = "printf 'caf\\351\\r\\nend' > /tmp/latin.txt"
    await runtime.execute(Command(command=latin, shell=True, check=True))
    as_latin = ReadFileRequest(path="/tmp/latin.txt", encoding="latin-1")
    assert (await runtime.read_file(as_latin)).content == "caf\u00e9\nend"
    replaced = ReadFileRequest(path="/tmp/latin.txt", errors="replace")
    assert (await runtime.read_file(replaced)).content == "caf\ufffd\nend"
    with pytest.raises(UnicodeDecodeError):
        await runtime.read_file(ReadFileRequest(path="/tmp/latin.txt"))


async def test_commands_add_env_and_keep_the_sandbox_path(runtime: CorralRuntime) -> None:
    done = await runtime.execute(
        Command(command='echo "$GREETING"; command -v sh', shell=True, env={"GREETING": "hi"})
    )
    assert done.stdout.splitlines()[0] == "hi"
    assert done.exit_code == 0
