"""`exec_remote` of the `corral` Inspect sandbox, natively on corral's processes, on a real
Docker Engine.

Inspect 0.3.285's own sandbox suite (`inspect_ai.util._sandbox.self_check`) has no
`exec_remote` checks, so these are written from its documented semantics
(`SandboxEnvironment.exec_remote`, `ExecRemoteProcess`, the options): the handle returns
once the process runs, events stream while it runs and end with one `ExecCompleted`, a
handle iterates once, stdin is written and closed (or kept open with `stdin_open`),
`kill()` ends the process (no `ExecCompleted`), a cancelled wait kills it, `stream=False`
returns an `ExecResult` and raises `TimeoutError` after killing the process. Where the
result of a command is defined, it is also compared with Inspect's own implementation
(what `sandbox().exec_remote` runs: its tool server injected into the same sandbox,
polled through `exec`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from inspect_ai.util import (
    ExecCompleted,
    ExecOutput,
    ExecRemoteAwaitableOptions,
    ExecRemoteProcess,
    ExecRemoteStreamingOptions,
    ExecResult,
    ExecStderr,
    ExecStdout,
)
from inspect_ai.util._sandbox.events import SandboxEnvironmentProxy

from corral.adapters.inspect import CorralSandboxEnvironment
from corral.adapters.inspect.remote import CorralExecRemoteProcess
from corral.providers.docker.session import DockerSession
from tests.integration.adapters.inspect_configs import DOCKER_NONROOT

pytestmark = [pytest.mark.anyio, pytest.mark.docker]


@pytest.fixture(scope="module")
async def env(engine: Any, owner: str) -> AsyncIterator[CorralSandboxEnvironment]:
    # One sandbox (as a non-root default user) shared by the module's checks.
    task = "exec-remote"
    config = DOCKER_NONROOT.config(owner)
    await CorralSandboxEnvironment.task_init(task, config)
    envs = await CorralSandboxEnvironment.sample_init(task, config, {})
    try:
        yield envs["default"].as_type(CorralSandboxEnvironment)
    finally:
        await CorralSandboxEnvironment.sample_cleanup(task, config, envs, False)
        await CorralSandboxEnvironment.task_cleanup(task, config, True)


def _in_container(engine: Any, env: CorralSandboxEnvironment) -> list[str]:
    """The container's command lines, as the engine sees them (not the sandbox's ps)."""
    session = env.session
    assert isinstance(session, DockerSession)
    top: dict[str, Any] = engine.api.top(session.sandbox)
    column = top["Titles"].index("CMD")
    rows: list[list[str]] = top.get("Processes") or []
    return [row[column] for row in rows]


async def _events(proc: ExecRemoteProcess) -> list[ExecOutput]:
    with anyio.fail_after(30):
        return [event async for event in proc]


async def _rest(proc: ExecRemoteProcess) -> list[ExecOutput]:
    """The events left, after a loop over the handle stopped (it iterates only once)."""
    events: list[ExecOutput] = []
    with anyio.fail_after(30):
        while True:
            try:
                events.append(await proc.__anext__())
            except StopAsyncIteration:
                return events


async def _running(env: CorralSandboxEnvironment, proc: ExecRemoteProcess) -> bool:
    assert isinstance(proc, CorralExecRemoteProcess)
    return {p.id: p for p in await env.session.processes()}[proc.process.id].running


def _text(events: list[ExecOutput], kind: type[ExecStdout | ExecStderr]) -> str:
    return "".join(e.data for e in events if isinstance(e, kind))


async def test_the_handle_comes_back_once_the_process_runs(env: CorralSandboxEnvironment) -> None:
    proc = await env.exec_remote(["sh", "-c", "echo $$ > /tmp/started; exec sleep 60"])
    # Returned means started: the file is there without waiting for it.
    started = await env.exec(["cat", "/tmp/started"])
    assert started.success and started.stdout.strip().isdigit()
    assert isinstance(proc.pid, int)
    assert await _running(env, proc)
    await proc.kill()
    assert not await _running(env, proc)


async def test_output_streams_while_it_runs_then_one_completion(
    env: CorralSandboxEnvironment,
) -> None:
    proc = await env.exec_remote(["sh", "-c", "echo first; sleep 3; echo second >&2; exit 3"])
    began = time.monotonic()
    seen: list[tuple[float, ExecOutput]] = []
    async for event in proc:
        seen.append((time.monotonic() - began, event))
    events = [event for _, event in seen]
    assert events == [ExecStdout("first\n"), ExecStderr("second\n"), ExecCompleted(exit_code=3)]
    assert seen[0][0] < 2, "the first line came only when the process ended"
    assert not events[-1].success  # type: ignore[union-attr]
    with pytest.raises(RuntimeError, match="iterated once"):
        async for _ in proc:
            pass


async def test_a_character_split_across_writes_stays_whole(env: CorralSandboxEnvironment) -> None:
    proc = await env.exec_remote(["sh", "-c", r"printf '\342\202'; sleep 0.5; printf '\254\377\n'"])
    events = await _events(proc)
    assert _text(events, ExecStdout) == "\u20ac\ufffd\n"


async def test_input_is_written_and_stdin_closed(env: CorralSandboxEnvironment) -> None:
    proc = await env.exec_remote(["cat"], ExecRemoteStreamingOptions(input="one\ntwo\n"))
    events = await _events(proc)
    assert _text(events, ExecStdout) == "one\ntwo\n"
    assert events[-1] == ExecCompleted(exit_code=0)
    # Without input or stdin_open, stdin is at its end at once.
    assert (await env.exec_remote(["cat"], stream=False)).stdout == ""
    # Binary input goes through as it is; a reader that is gone is no error.
    binary = bytes(range(256))
    result = await env.exec_remote(
        ["od", "-An", "-tx1", "-v"], ExecRemoteAwaitableOptions(input=binary), stream=False
    )
    assert bytes.fromhex(result.stdout) == binary
    assert (
        await env.exec_remote(
            ["true"], ExecRemoteAwaitableOptions(input="x" * 300_000), stream=False
        )
    ).success


async def test_stdin_open_takes_writes_until_closed(env: CorralSandboxEnvironment) -> None:
    proc = await env.exec_remote(
        ["sh", "-c", "while read line; do echo got $line; done; echo eof"],
        ExecRemoteStreamingOptions(input="a\n", stdin_open=True),
    )
    await proc.write_stdin("b\n")
    await proc.write_stdin(b"c\n")
    await proc.close_stdin()
    await proc.close_stdin()  # idempotent
    events = await _events(proc)
    assert _text(events, ExecStdout) == "got a\ngot b\ngot c\neof\n"
    with pytest.raises(RuntimeError, match="terminated"):
        await proc.write_stdin("late\n")
    await proc.close_stdin()  # a no-op once it has ended
    closed = await env.exec_remote(["cat"])
    with pytest.raises(RuntimeError, match="stdin_open=True"):
        await closed.write_stdin("x")
    with pytest.raises(RuntimeError, match="stdin_open=True"):
        await closed.close_stdin()
    await _events(closed)


async def test_kill_ends_it_without_a_completion(
    env: CorralSandboxEnvironment, engine: Any
) -> None:
    proc = await env.exec_remote(["sh", "-c", "echo before; sleep 3601 & sleep 3602"])
    with anyio.fail_after(10):
        async for event in proc:
            assert event == ExecStdout("before\n")
            break
    await proc.kill()
    await proc.kill()  # a no-op the second time
    assert await _rest(proc) == []  # no ExecCompleted after a kill
    assert not [c for c in _in_container(engine, env) if "sleep 360" in c]


async def test_kill_gives_sigterm_its_grace_then_kills(
    env: CorralSandboxEnvironment, engine: Any
) -> None:
    # `eval`: the traps are the group leader's own (the shell that runs the command line).
    graceful = await env.exec_remote(["eval", "trap 'echo bye; exit 0' TERM; sleep 3603 & wait"])
    stubborn = await env.exec_remote(["eval", "trap '' TERM; sleep 3604 & wait; sleep 3605"])
    await anyio.sleep(0.3)  # the traps are set
    began = time.monotonic()
    await graceful.kill()
    polite = time.monotonic() - began
    await stubborn.kill()
    forced = time.monotonic() - began - polite
    assert polite < 3, polite
    assert forced >= 4.5, forced
    assert await _events(graceful) == [ExecStdout("bye\n")]
    assert await _events(stubborn) == []
    assert not [c for c in _in_container(engine, env) if "sleep 360" in c]


async def test_a_cancelled_wait_kills_the_process(
    env: CorralSandboxEnvironment, engine: Any
) -> None:
    proc = await env.exec_remote(["sh", "-c", "echo up; exec sleep 3606"])
    got: list[ExecOutput] = []

    async def read() -> None:
        async for event in proc:
            got.append(event)

    with anyio.move_on_after(1.5):
        await read()
    assert got == [ExecStdout("up\n")]
    assert not await _running(env, proc)
    assert not [c for c in _in_container(engine, env) if "sleep 3606" in c]


async def test_awaitable_mode_returns_the_result_or_times_out(
    env: CorralSandboxEnvironment, engine: Any
) -> None:
    result = await env.exec_remote(
        ["sh", "-c", 'echo "$PWD $GREETING $(whoami)"; echo oops >&2; exit 4'],
        ExecRemoteAwaitableOptions(cwd="/tmp", env={"GREETING": "hi"}, user="root"),
        stream=False,
    )
    assert result == ExecResult(
        success=False, returncode=4, stdout="/tmp hi root\n", stderr="oops\n"
    )
    began = time.monotonic()
    with pytest.raises(TimeoutError):
        await env.exec_remote(
            ["sh", "-c", "sleep 3607"], ExecRemoteAwaitableOptions(timeout=1), stream=False
        )
    assert time.monotonic() - began < 1 + 5 + 3  # the timeout, the SIGTERM grace at most
    assert not [c for c in _in_container(engine, env) if "sleep 3607" in c]


async def test_a_task_group_cancelled_around_it_leaves_nothing(
    env: CorralSandboxEnvironment, engine: Any
) -> None:
    # Inspect's own example: a server run with stream=False in a task group, cancelled.
    async with anyio.create_task_group() as group:
        group.start_soon(lambda: env.exec_remote(["sleep", "3608"], stream=False))
        await anyio.sleep(1)
        assert [c for c in _in_container(engine, env) if "sleep 3608" in c]
        group.cancel_scope.cancel()
    assert not [c for c in _in_container(engine, env) if "sleep 3608" in c]


#: Commands whose whole result is defined, compared with Inspect's own implementation.
SAME_AS_INSPECT = [
    pytest.param(["sh", "-c", "echo out; echo err >&2; exit 3"], None, id="codes-and-streams"),
    pytest.param(["cat"], "piped\n", id="input"),
    pytest.param(["no-such-program"], None, id="missing-program"),
    pytest.param(["sh", "-c", "kill -TERM $$"], None, id="signalled"),
    pytest.param(["sh", "-c", "printf 'a\\377b'"], None, id="invalid-utf8"),
]


@pytest.mark.parametrize(("cmd", "stdin"), SAME_AS_INSPECT)
async def test_results_are_those_of_inspects_own_implementation(
    env: CorralSandboxEnvironment, cmd: list[str], stdin: str | None
) -> None:
    options = ExecRemoteAwaitableOptions(input=stdin, timeout=60)
    native = await env.exec_remote(cmd, options, stream=False)
    # What `sandbox()` hands a solver: Inspect's proxy, which runs Inspect's implementation.
    inspects = await SandboxEnvironmentProxy(env).exec_remote(cmd, options, stream=False)
    assert native == inspects
