"""Running one command as its own process group, streamed, bounded, killed exactly.

The group leader is waited for without being reaped (`waitid(WNOWAIT)` on a pidfd), so
its pid, and with it the group id, cannot be reused until corral has killed the group.
That makes the kill exact: it can only hit processes this exec started.

With a session cgroup, the command first stops itself (`_HOLD`) until corral has moved it
into that cgroup, so nothing it runs ever starts outside it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from typing import IO

import anyio

from corral.core.capture import Capture
from corral.core.session import (
    TIMEOUT_RETURNCODE,
    ExecResult,
    OutputCallback,
    Stream,
)
from corral.errors import ExecUserRefused, ProviderError
from corral.providers.local.cgroup import SessionCgroup

READ_SIZE = 64 * 1024
DRAIN_AFTER_EXIT_S = 2.0
_HOLD = 'kill -STOP $$ && exec "$@"'


async def run_process(
    args: list[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    user: str | None,
    timeout: float | None,
    stdin: bytes | None,
    on_output: OutputCallback | None,
    output_limit: int,
    cgroup: SessionCgroup | None,
) -> ExecResult:
    started = time.monotonic()
    if cgroup is not None:
        args = ["sh", "-c", _HOLD, "sh", *args]
    try:
        proc = await _spawn(args, cwd=cwd, env=env, user=user, piped_stdin=stdin is not None)
    except FileNotFoundError as exc:
        return _not_found(exc, started)
    assert proc.stdout is not None and proc.stderr is not None
    capture = Capture(output_limit, on_output)
    pidfd = os.pidfd_open(proc.pid)
    timed_out = False
    try:
        if cgroup is not None:
            await _place(proc.pid, cgroup)
        async with anyio.create_task_group() as readers:
            readers.start_soon(_pump, proc.stdout.fileno(), "stdout", capture)
            readers.start_soon(_pump, proc.stderr.fileno(), "stderr", capture)
            if stdin is not None and proc.stdin is not None:
                readers.start_soon(_feed, proc.stdin, stdin)
            with anyio.move_on_after(timeout) as scope:
                await _wait_exit(pidfd, proc.pid)
            timed_out = scope.cancelled_caught
            _kill_group(proc.pid)
            # Stragglers that escaped the group could hold the pipes open forever.
            readers.cancel_scope.deadline = anyio.current_time() + DRAIN_AFTER_EXIT_S
    finally:
        with anyio.CancelScope(shield=True):
            _kill_group(proc.pid)
            await anyio.to_thread.run_sync(proc.wait)
            os.close(pidfd)
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
    await capture.finish()
    code = proc.returncode
    returncode = TIMEOUT_RETURNCODE if timed_out else (128 - code if code < 0 else code)
    return capture.result(returncode, timed_out=timed_out)


async def _spawn(
    args: list[str], *, cwd: str, env: Mapping[str, str], user: str | None, piped_stdin: bool
) -> subprocess.Popen[bytes]:
    """`args` started in a session of its own, its output piped; a missing program raises
    FileNotFoundError as it is."""
    try:
        return await anyio.to_thread.run_sync(
            lambda: subprocess.Popen(
                args,
                stdin=subprocess.PIPE if piped_stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=dict(env),
                user=user,
                start_new_session=True,
            )
        )
    except FileNotFoundError:
        raise
    except KeyError:  # subprocess looks `user` up in this host's passwd
        raise ExecUserRefused(f"exec user {user!r} does not exist on this host") from None
    except (OSError, ValueError) as exc:
        raise ProviderError(f"could not start {args[0]!r}: {exc}") from exc


def _not_found(exc: FileNotFoundError, started: float) -> ExecResult:
    # Same as a shell: a missing program is exit code 127, not a transport failure.
    return ExecResult(
        returncode=127,
        stdout="",
        stderr=f"{exc.filename or exc}: command not found\n",
        duration_s=time.monotonic() - started,
    )


async def _place(pid: int, cgroup: SessionCgroup) -> None:
    """Once `_HOLD` has stopped itself, move it into the cgroup and let it go on."""
    # WNOWAIT: only look; the exit, if it came first, is still there for _wait_exit.
    info = await anyio.to_thread.run_sync(
        os.waitid, os.P_PID, pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT
    )
    if info is None or info.si_code != os.CLD_STOPPED:
        return
    cgroup.join(pid)
    os.kill(pid, signal.SIGCONT)


async def _wait_exit(pidfd: int, pid: int) -> None:
    while True:
        await anyio.wait_readable(pidfd)
        # WNOHANG: the pidfd said it exited, so this never blocks.
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)  # noqa: ASYNC222
        if info is not None:
            return


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


async def _pump(fd: int, stream: Stream, capture: Capture) -> None:
    os.set_blocking(fd, False)
    while True:
        await anyio.wait_readable(fd)
        try:
            chunk = os.read(fd, READ_SIZE)
        except BlockingIOError:
            continue
        if not chunk:
            return
        await capture.emit(stream, chunk)


async def _feed(pipe: IO[bytes], data: bytes) -> None:
    fd = pipe.fileno()
    os.set_blocking(fd, False)
    view = memoryview(data)
    try:
        while view:
            await anyio.wait_writable(fd)
            try:
                written = os.write(fd, view)
            except BlockingIOError:
                continue
            view = view[written:]
    except BrokenPipeError:
        pass
    finally:
        pipe.close()
