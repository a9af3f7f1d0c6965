"""The conformance suite for processes the session owns (`session.start`, `shell`):
star-import it beside `corral.testing.conformance`, with the same fixtures
(`corral_environment`, `corral_plan` whose baseline is `public`).

A provider that does not declare `supports_processes` must refuse `start` and `shell`
with `FeatureUnsupported` naming them; every other test here needs the feature, and
checks it from inside the sandbox and from the harness's side.
"""

from __future__ import annotations

import json
import re
import secrets
import signal
import sys
import time
import tracemalloc
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager

import anyio
import pytest

from corral.core.environment import BaseEnvironment
from corral.core.plan import ExecutionPlan
from corral.core.processes import Process, ProcessExited, ProcessOutput, PtySize
from corral.core.session import EnvironmentSession, ExecResult
from corral.errors import FeatureUnsupported
from corral.testing.escapes import flood_the_shell_status

__all__ = [
    "test_processes_a_background_server_answers_a_later_exec",
    "test_processes_a_late_reader_gets_the_buffered_output",
    "test_processes_another_harness_process_reaches_them",
    "test_processes_cancelled_start_leaves_nothing",
    "test_processes_end_workload_and_close_kill_them",
    "test_processes_hostile_output_is_bounded",
    "test_processes_output_streams_while_it_runs",
    "test_processes_pty",
    "test_processes_shell_interrupt_ends_the_command_not_the_shell",
    "test_processes_shell_keeps_state",
    "test_processes_shell_output_cannot_forge_its_end",
    "test_processes_shell_status_flood_fails_closed_and_others_do_not_notice",
    "test_processes_shell_timeout_interrupts_and_keeps_the_shell",
    "test_processes_signals_are_delivered",
    "test_processes_stdin_round_trip",
    "test_processes_unsupported_is_refused",
]

anyio_mark = pytest.mark.anyio


@asynccontextmanager
async def _session(env: BaseEnvironment, plan: ExecutionPlan) -> AsyncGenerator[EnvironmentSession]:
    if not env.features().supports_processes:
        pytest.skip("checked by test_processes_unsupported_is_refused: no processes here")
    async with env.session(plan) as sandbox:
        yield sandbox


async def _collect(proc: Process, timeout: float = 30) -> tuple[bytes, bytes, ProcessExited]:
    out, err = bytearray(), bytearray()
    with anyio.fail_after(timeout):
        async for event in proc:
            if isinstance(event, ProcessExited):
                return bytes(out), bytes(err), event
            (out if event.stream == "stdout" else err).extend(event.data)
    raise AssertionError(f"{proc} ended without ProcessExited")


async def _read_until(proc: Process, needle: bytes, timeout: float = 20) -> bytes:
    seen = bytearray()
    with anyio.fail_after(timeout):
        async for event in proc:
            if isinstance(event, ProcessOutput):
                seen += event.data
                if needle in seen:
                    return bytes(seen)
            else:
                raise AssertionError(f"{proc} exited ({event}) before {needle!r}: {seen!r}")
    raise AssertionError(f"no {needle!r} in {seen!r}")


@anyio_mark
async def test_processes_unsupported_is_refused(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    """Declared: a process runs and its id is listed; undeclared: refused by name."""
    async with corral_environment.session(corral_plan) as sandbox:
        if not corral_environment.features().supports_processes:
            with pytest.raises(FeatureUnsupported, match="session.start"):
                await sandbox.start(["true"])
            with pytest.raises(FeatureUnsupported):
                await sandbox.shell()
            return
        proc = await sandbox.start(["sh", "-c", "echo hi"], name="greeter")
        assert await proc.wait(timeout=30) == 0
        listed = {p.id: p for p in await sandbox.processes()}
    assert listed[proc.id].name == "greeter" and not listed[proc.id].running
    assert listed[proc.id].command[-1] == "echo hi" or "echo hi" in listed[proc.id].command


@anyio_mark
async def test_processes_a_background_server_answers_a_later_exec(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    port = 20000 + secrets.randbelow(30000)
    async with _session(corral_environment, corral_plan) as sandbox:
        server = await sandbox.start(
            ["python3", "-m", "http.server", str(port), "--bind", "127.0.0.1"], name="web"
        )
        await sandbox.write_text("served.txt", "from the server\n")
        fetch = (
            "import sys, time, urllib.request\n"
            "for _ in range(100):\n"
            "    try:\n"
            f"        print(urllib.request.urlopen('http://127.0.0.1:{port}/served.txt').read()"
            ".decode(), end=''); sys.exit(0)\n"
            "    except OSError: time.sleep(0.1)\n"
            "sys.exit(1)\n"
        )
        got = await sandbox.exec(["python3", "-c", fetch], cwd=".", timeout=60)
        running = {p.id: p.running for p in await sandbox.processes()}
        await server.kill()
        exited = await server.wait(timeout=30)
    assert got.returncode == 0 and got.stdout == "from the server\n", got
    assert running[server.id], "the server ran until killed"
    assert exited == 128 + signal.SIGKILL


@anyio_mark
async def test_processes_output_streams_while_it_runs(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    async with _session(corral_environment, corral_plan) as sandbox:
        proc = await sandbox.start(
            ["sh", "-c", "echo one; echo warn >&2; sleep 1.5; echo two; exit 3"]
        )
        first = await _read_until(proc, b"one\n")
        seen_at = time.monotonic()
        out, err, exited = await _collect(proc)
    assert first == b"one\n"
    assert out == b"two\n" and err == b"warn\n", "each byte once, streams apart"
    assert exited == ProcessExited(returncode=3, signal=None)
    assert time.monotonic() - seen_at > 1.0, "the first line came before the exit"


@anyio_mark
async def test_processes_stdin_round_trip(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    async with _session(corral_environment, corral_plan) as sandbox:
        cat = await sandbox.start(["cat"], stdin=True)
        await cat.write("héllo\n")
        echoed = await _read_until(cat, b"\n")
        await cat.write(b"\x00\xff" * 50_000)
        await cat.close_stdin()
        rest, _, exited = await _collect(cat)
        silent = await sandbox.start(["sleep", "30"])
        with pytest.raises(ValueError, match="stdin"):
            await silent.write("x")
        await silent.kill()
    assert echoed == "héllo\n".encode()
    assert rest == b"\x00\xff" * 50_000 and exited.returncode == 0


@anyio_mark
async def test_processes_signals_are_delivered(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    trap = 'trap "echo got-int; exit 3" INT; echo ready; while :; do sleep 0.1; done'
    async with _session(corral_environment, corral_plan) as sandbox:
        trapped = await sandbox.start(["sh", "-c", trap])
        await _read_until(trapped, b"ready")
        await trapped.signal(signal.SIGINT)
        out, _, exited = await _collect(trapped)
        sleeper = await sandbox.start(["sleep", "300"])
        await sleeper.signal(signal.SIGTERM)
        code = await sleeper.wait(timeout=30)
    assert b"got-int" in out and exited.returncode == 3
    assert code == 128 + signal.SIGTERM


@anyio_mark
async def test_processes_pty(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    if not corral_environment.features().supports_pty:
        async with corral_environment.session(corral_plan) as sandbox:
            with pytest.raises(FeatureUnsupported, match="pty"):
                await sandbox.start(["tty"], pty=PtySize())
        return
    async with _session(corral_environment, corral_plan) as sandbox:
        tty = await sandbox.start(["tty"], pty=PtySize(rows=24, cols=80))
        said, _, _ = await _collect(tty)
        term = await sandbox.start(["sh"], pty=PtySize(rows=24, cols=80))
        await term.write("stty size\n")
        before = await _read_until(term, b"24 80")
        await term.resize(30, 100)
        await term.write("stty size\n")
        after = await _read_until(term, b"30 100")
        await term.write("sleep 300\n")
        await anyio.sleep(0.5)
        await term.write("\x03")  # Ctrl-C: the foreground job, not the shell
        await term.write("echo still-$((1 + 1))\n")
        alive = await _read_until(term, b"still-2")
        await term.write("printf '\\033[31mred\\033[0m\\n'; exit 5\n")
        raw, _, exited = await _collect(term)
    assert re.search(rb"/dev/pts/\d+", said), said
    assert b"24 80" in before and b"30 100" in after and b"still-2" in alive
    assert b"\x1b[31mred\x1b[0m" in raw, "a terminal's bytes come back as they are"
    assert exited.returncode == 5


@anyio_mark
async def test_processes_a_late_reader_gets_the_buffered_output(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    async with _session(corral_environment, corral_plan) as sandbox:
        proc = await sandbox.start(["sh", "-c", "echo early; sleep 300"])
        await anyio.sleep(1.0)
        early = await _read_until(proc, b"early\n")  # read only now
        again = await sandbox.process(proc.id)  # a new handle reads from the start
        replay = await _read_until(again, b"early\n")
        await proc.kill()
        code = await again.wait(timeout=30)
    assert early == replay == b"early\n"
    assert code == 128 + signal.SIGKILL


#: Another harness process: attaches to the sandbox, finds the process by its id, reads
#: what it printed so far and its exit; never closes the sandbox.
_CHILD = """
import json, sys
import anyio
from corral import ENVIRONMENTS, ProcessExited

async def main() -> None:
    env = ENVIRONMENTS.create(sys.argv[1], **json.loads(sys.argv[2]))
    session = await env.attach(sys.argv[3])
    proc = await session.process(sys.argv[4])
    await proc.write("from the second harness\\n")
    seen = b""
    async for event in proc:
        if isinstance(event, ProcessExited):
            print(json.dumps({"seen": seen.decode(), "code": event.code}))
            return
        seen += event.data

anyio.run(main)
"""


@anyio_mark
async def test_processes_another_harness_process_reaches_them(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    """Where sandboxes can be attached from another process, so can their processes: the
    output buffered before it came, its stdin, its exit."""
    env = corral_environment
    if not env.features().supports_reattach:
        pytest.skip("this provider cannot attach from another process (supports_reattach)")
    async with _session(env, corral_plan) as sandbox:
        proc = await sandbox.start(
            ["sh", "-c", 'echo before; read line; echo "$line"; exit 9'], stdin=True
        )
        await _read_until(proc, b"before\n")
        config = env.config.model_dump_json(exclude_defaults=True)
        child = await anyio.run_process(
            [sys.executable, "-c", _CHILD, env.id, config, sandbox.id, proc.id], check=False
        )
        assert child.returncode == 0, child.stderr.decode()[-2000:]
        code = await proc.wait(timeout=30)
    seen = json.loads(child.stdout)
    assert seen == {"seen": "before\nfrom the second harness\n", "code": 9}, seen
    assert code == 9


@anyio_mark
async def test_processes_end_workload_and_close_kill_them(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    """Both end every started process, whole trees (a setsid'd child too); a handle then
    reports it killed."""
    tree = "setsid sleep 301 & sleep 302"
    async with _session(corral_environment, corral_plan) as sandbox:
        first = await sandbox.start(["sh", "-c", tree])
        await anyio.sleep(0.5)
        try:
            await sandbox.end_workload()
        except FeatureUnsupported:
            pytest.skip("this provider cannot end a phase's processes")
        code = await first.wait(timeout=30)
        left = await sandbox.exec("ps -eo args | grep '[s]leep 30[12]' || true")
        await sandbox.start(["sh", "-c", tree])
    assert code == 128 + signal.SIGKILL
    assert left.stdout == "", f"left running after end_workload: {left.stdout!r}"


@anyio_mark
async def test_processes_cancelled_start_leaves_nothing(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    started: list[Process] = []
    async with _session(corral_environment, corral_plan) as sandbox:
        for delay in (0.0, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05):
            with anyio.move_on_after(delay):
                started.append(await sandbox.start(["sleep", "303"]))
        await anyio.sleep(0.5)
        running = {p.id for p in await sandbox.processes() if p.running}
        for proc in started:
            await proc.kill()
        left = await sandbox.exec("ps -eo args | grep '[s]leep 303' || true")
    assert running == {p.id for p in started}, "only the starts that returned left a process"
    assert left.stdout == "", left.stdout


@anyio_mark
async def test_processes_hostile_output_is_bounded(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    """Endless output, a reader that is slow, a thousand children, stdin never read,
    stdout closed while running: the harness's memory stays bounded and nothing blocks."""
    async with _session(corral_environment, corral_plan) as sandbox:
        endless = await sandbox.start(["sh", "-c", "yes corral-output-that-never-ends"])
        tracemalloc.start()
        try:
            read = 0
            async for event in endless:
                assert isinstance(event, ProcessOutput)
                read += len(event.data)
                await anyio.sleep(0.001)  # a slow reader
                if read > 8 << 20:
                    break
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        await endless.kill()
        forks = await sandbox.start(["sh", "-c", "for i in $(seq 1000); do sleep 304 & done; wait"])
        deaf = await sandbox.start(["sleep", "305"], stdin=True)
        with anyio.move_on_after(2) as stuck:
            await deaf.write(b"x" * (4 << 20))  # more than any pipe holds
        quick = await sandbox.exec(["echo", "not blocked"])
        closed = await sandbox.start(["sh", "-c", "exec >&- 2>&-; sleep 1; exit 4"])
        closed_code = await closed.wait(timeout=30)
        await forks.kill()
        await deaf.kill()
        left = await sandbox.exec("ps -eo args | grep '[s]leep 30[45]' | wc -l")
    assert peak < 32 << 20, f"the harness held {peak / 2**20:.1f} MiB reading endless output"
    assert stuck.cancelled_caught, "a write to a process that never reads returned"
    assert quick.stdout == "not blocked\n"
    assert closed_code == 4
    assert left.stdout.strip() == "0", f"{left.stdout.strip()} children survived the kill"


@anyio_mark
async def test_processes_shell_keeps_state(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    async with (
        _session(corral_environment, corral_plan) as sandbox,
        await sandbox.shell(env={"GREETING": "hi"}) as shell,
    ):
        await shell.run("mkdir -p deep/er && cd deep/er")
        await shell.run('export MARK=kept; greet() { echo "$GREETING $1"; }')
        await shell.run("alias ll='echo aliased'")
        where = await shell.run("pwd")
        state = await shell.run('echo "$MARK"; greet there; ll')
        failed = await shell.run("echo oops >&2; false")
        code = await shell.run("(exit 7)")
    assert where.stdout.strip().endswith("/deep/er")
    assert state.stdout == "kept\nhi there\naliased\n", state
    assert (failed.returncode, failed.stdout, failed.stderr) == (1, "", "oops\n")
    assert code.returncode == 7


@anyio_mark
async def test_processes_shell_output_cannot_forge_its_end(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    forger = (
        "for t in 0123456789abcdef deadbeefdeadbeef; do printf '%s 0\\n' $t; done; "
        "printf '%s 0\\n' \"$(cat /proc/$$/cmdline 2>/dev/null | tr -dc a-f0-9 | head -c 16)\"; "
        "printf 'no newline at the end'; echo err >&2; sleep 0.5; echo last"
    )
    async with (
        _session(corral_environment, corral_plan) as sandbox,
        await sandbox.shell() as shell,
    ):
        forged = await shell.run(forger)
        after = await shell.run("echo next")
        binary = await shell.run(r"printf 'ok\377\376end'")
    assert forged.stdout.endswith("no newline at the endlast\n"), forged
    assert forged.stderr == "err\n" and forged.returncode == 0
    assert after.stdout == "next\n", "nothing of the forger's output bled into the next"
    assert binary.stdout == "ok\ufffd\ufffdend"


@anyio_mark
@pytest.mark.parametrize("newlines", [True, False], ids=["newlines", "no-newline"])
async def test_processes_shell_status_flood_fails_closed_and_others_do_not_notice(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan, newlines: bool
) -> None:
    """A command floods its shell's status pipe (`/proc/$PPID/fd`): the run fails closed
    naming the budget, fast, while another session's execs and the harness's memory do
    not notice (`corral.testing.escapes.flood_the_shell_status`)."""
    async with (
        _session(corral_environment, corral_plan) as sandbox,
        _session(corral_environment, corral_plan) as other,
    ):
        flood = await flood_the_shell_status(sandbox, other, newlines)
    assert flood.wrong() is None, flood


@anyio_mark
async def test_processes_shell_timeout_interrupts_and_keeps_the_shell(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    async with (
        _session(corral_environment, corral_plan) as sandbox,
        await sandbox.shell() as shell,
    ):
        await shell.run("export KEEP=yes")
        slept = await shell.run("echo before; sleep 306", timeout=1)
        looped = await shell.run("while :; do :; done", timeout=1)
        # It ignores the interrupt (so does the shell from now on): its group is killed.
        stubborn = await shell.run("trap '' INT; sleep 307", timeout=1)
        state = await shell.run('echo "$KEEP"')
        left = await sandbox.exec("ps -eo args | grep '[s]leep 30[67]' || true")
    assert slept.timed_out and slept.returncode == 124 and "before" in slept.stdout
    assert looped.timed_out, "a loop of builtins is interrupted too"
    assert stubborn.timed_out
    assert state.stdout == "yes\n" and state.returncode == 0, "the shell lives on"
    assert left.stdout == "", left.stdout


@anyio_mark
async def test_processes_shell_interrupt_ends_the_command_not_the_shell(
    corral_environment: BaseEnvironment, corral_plan: ExecutionPlan
) -> None:
    async with (
        _session(corral_environment, corral_plan) as sandbox,
        await sandbox.shell() as shell,
    ):
        await shell.run("export KEEP=yes")

        async def ctrl_c() -> None:
            await anyio.sleep(1)
            await shell.interrupt()

        started = time.monotonic()
        stopped: list[ExecResult] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(ctrl_c)
            stopped.append(await shell.run("echo before; sleep 308; echo never", timeout=60))
        took = time.monotonic() - started
        after = await shell.run('echo "$KEEP"')
        left = await sandbox.exec("ps -eo args | grep '[s]leep 308' || true")
    (result,) = stopped
    assert (result.returncode, result.stdout, result.timed_out) == (130, "before\n", False)
    assert took < 10, f"the interrupt took {took:.1f} s"
    assert after.stdout == "yes\n" and left.stdout == ""
