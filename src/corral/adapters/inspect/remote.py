"""Inspect's `exec_remote` on corral's own processes (`session.start`): nothing injected
into the sandbox, nothing polled; the output streams as the process writes it.

Inspect's default implementation copies its tool server into the sandbox and polls it
through `exec`. Here the command is a process of the session, with Inspect's semantics
(`inspect_ai.util._sandbox.exec_remote` and the tool server it talks to):

- The command line runs as Inspect's tool server runs it, `/bin/sh -c` on the quoted
  argv, so a missing program is a completed process with exit code 127, as there.
- `input` is written to its stdin before `exec_remote` returns; stdin is then closed,
  unless `stdin_open=True` (streaming options), which keeps it for `write_stdin` and
  `close_stdin`. Without either, stdin is `/dev/null`. Bytes go through as they are.
- Iterating yields `ExecStdout`/`ExecStderr` (each stream decoded as UTF-8 incrementally,
  invalid bytes replaced, so a character split across chunks stays whole), then one
  `ExecCompleted(exit_code)`: -n when signal n ended it, as Inspect's tool server
  reports it (Python's convention; a shell that outlives its child reports 128 + n). A
  handle iterates once.
- `kill()` sends SIGTERM to the process group, waits up to `KILL_GRACE_S` (as Inspect's
  tool server does), then kills the whole tree; the iteration then yields what output is
  left and stops without `ExecCompleted`. A task cancelled while it awaits an event kills
  the process first; one cancelled while `exec_remote` starts it leaves nothing running.
- `stream=False` collects the output (the last `MAX_EXEC_OUTPUT_SIZE` bytes of each
  stream, as Inspect keeps them) into an `ExecResult`; `timeout` kills the process and
  raises `TimeoutError`; a process killed meanwhile gives returncode -1.
- `pid` is the process's number in corral's process manager (never reused within the
  sandbox); `process` is the corral handle (`process.id` for `session.process(id)`).
- The `poll_*` options and `concurrency` concern polling and local subprocesses: there
  is neither here, so they change nothing.
"""

from __future__ import annotations

import codecs
import contextlib
import logging
import shlex
import signal
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import anyio
from inspect_ai.util import (
    ExecCompleted,
    ExecOutput,
    ExecRemoteAwaitableOptions,
    ExecRemoteProcess,
    ExecRemoteStreamingOptions,
    ExecResult,
    ExecStderr,
    ExecStdout,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
)
from inspect_ai.util._sandbox.exec_remote import MIN_POLL_INTERVAL, ExecRemoteCommonOptions
from inspect_ai.util._subprocess import CircularByteBuffer

from corral.core.processes import Process, ProcessEvent, ProcessOutput
from corral.errors import (
    ConfigError,
    ExecUserUnsupported,
    FeatureUnsupported,
    ProcessNotFound,
    ProviderError,
)

if TYPE_CHECKING:
    from corral.adapters.inspect.sandbox import CorralSandboxEnvironment

log = logging.getLogger("corral.adapters.inspect")

#: seconds a killed process gets to end after SIGTERM before its tree is killed
KILL_GRACE_S = 5.0
#: how Inspect's tool server runs a command line
SHELL = "/bin/sh"

Options = ExecRemoteStreamingOptions | ExecRemoteAwaitableOptions | ExecRemoteCommonOptions


class CorralExecRemoteProcess(ExecRemoteProcess):
    """An `ExecRemoteProcess` whose events come from a corral process as it writes them."""

    def __init__(
        self, sandbox: CorralSandboxEnvironment, cmd: list[str], options: Options, process: Process
    ) -> None:
        super().__init__(sandbox, cmd, options, MIN_POLL_INTERVAL)
        self.process = process
        self._pid = int(process.id.rpartition("-")[2])
        self._session = sandbox.session
        self._service = sandbox.service
        self._decoders = {
            "stdout": codecs.getincrementaldecoder("utf-8")(errors="replace"),
            "stderr": codecs.getincrementaldecoder("utf-8")(errors="replace"),
        }
        self._events: AsyncIterator[ProcessEvent] | None = None
        self._ended = False

    async def __anext__(self) -> ExecOutput:
        if self._pending_events:
            return self._pending_events.pop(0)
        if self._ended:
            raise StopAsyncIteration
        try:
            while True:
                event = await self._next_event()
                if isinstance(event, ProcessOutput):
                    text = self._decoders[event.stream].decode(event.data)
                    if text:
                        return ExecStdout(text) if event.stream == "stdout" else ExecStderr(text)
                    continue
                self._ended = True
                for stream, decoder in self._decoders.items():
                    rest = decoder.decode(b"", final=True)
                    if rest:
                        kind = ExecStdout if stream == "stdout" else ExecStderr
                        self._pending_events.append(kind(rest))
                if not self._killed:
                    # After a kill() Inspect yields what output is left and no completion.
                    self._completed = True
                    code = (
                        event.returncode if event.returncode is not None else -(event.signal or 0)
                    )
                    self._pending_events.append(ExecCompleted(exit_code=code))
                if self._pending_events:
                    return self._pending_events.pop(0)
                raise StopAsyncIteration
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                try:
                    await self.kill()
                except Exception as exc:  # the cancellation goes on; the failure is logged
                    log.warning("killing cancelled exec_remote %s failed: %s", self.process.id, exc)
            raise

    async def _next_event(self) -> ProcessEvent:
        for _ in range(2):
            if self._events is None:
                # Resumes where the handle stopped reading (after a cancelled wait, too).
                self._events = aiter(self.process)
            try:
                return await anext(self._events)
            except StopAsyncIteration:
                self._events = None
        raise SandboxUnavailableError(f"process {self.process.id}'s output ended without its exit")

    async def write_stdin(self, data: str | bytes) -> None:
        if not (isinstance(self._options, ExecRemoteStreamingOptions) and self._options.stdin_open):
            raise RuntimeError(
                "write_stdin() requires stdin_open=True in ExecRemoteStreamingOptions"
            )
        if self._completed or self._killed:
            raise RuntimeError("Cannot write to stdin: process has terminated")
        try:
            await self.process.write(data)
        except (ConfigError, ProcessNotFound) as exc:
            raise RuntimeError(f"Cannot write to stdin: {exc}") from exc
        except ProviderError as exc:
            raise SandboxUnavailableError(str(exc)) from exc

    async def close_stdin(self) -> None:
        if not (isinstance(self._options, ExecRemoteStreamingOptions) and self._options.stdin_open):
            raise RuntimeError(
                "close_stdin() requires stdin_open=True in ExecRemoteStreamingOptions"
            )
        if self._completed or self._killed:
            return
        try:
            await self.process.close_stdin()
        except (ConfigError, ProcessNotFound):
            return  # it has exited: its stdin is closed
        except ProviderError as exc:
            raise SandboxUnavailableError(str(exc)) from exc

    async def kill(self) -> None:
        """SIGTERM to its group, up to `KILL_GRACE_S` to end, then its whole tree killed."""
        if self._completed or self._killed:
            return
        self._killed = True
        try:
            await self.process.signal(signal.SIGTERM)
            # A handle of its own, so that the iteration's keeps its place in the output.
            waiter = await self._session.process(self.process.id, service=self._service)
            with anyio.move_on_after(KILL_GRACE_S):
                await waiter.wait()
            await self.process.kill()
        except ProcessNotFound:
            return  # gone already, with the sandbox's workload
        except ProviderError as exc:
            raise SandboxUnavailableError(str(exc)) from exc


async def start(
    sandbox: CorralSandboxEnvironment, cmd: list[str], options: Options | None
) -> CorralExecRemoteProcess:
    """Start `cmd` as Inspect's `exec_remote` does; the handle once it runs."""
    opts = options or ExecRemoteCommonOptions()
    stdin_open = isinstance(opts, ExecRemoteStreamingOptions) and opts.stdin_open
    data = opts.input.encode("utf-8") if isinstance(opts.input, str) else opts.input
    try:
        process = await sandbox.session.start(
            [SHELL, "-c", shlex.join(cmd)],
            cwd=opts.cwd,
            env=sandbox.command_env(opts.env),
            user=opts.user,
            service=sandbox.service,
            stdin=stdin_open or data is not None,
            name="exec_remote",
        )
    except ExecUserUnsupported as exc:
        raise SandboxUserUnsupportedError(str(exc)) from exc
    except (ProviderError, FeatureUnsupported) as exc:
        raise SandboxUnavailableError(str(exc)) from exc
    try:
        # A process that exits (or closes its stdin) before it read all of its input is no
        # error, as with a pipe whose reader is gone.
        with contextlib.suppress(ConfigError):
            if data:
                await process.write(data)
            if data is not None and not stdin_open:
                await process.close_stdin()
    except BaseException:
        with anyio.CancelScope(shield=True):
            await process.kill()
        raise
    return CorralExecRemoteProcess(sandbox, cmd, opts, process)


async def run(
    sandbox: CorralSandboxEnvironment, cmd: list[str], options: Options | None
) -> ExecResult[str]:
    """`exec_remote(..., stream=False)`: the process run to its end (or `timeout`)."""
    proc = await start(sandbox, cmd, options)
    limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
    stdout, stderr = CircularByteBuffer(limit), CircularByteBuffer(limit)
    timeout = options.timeout if isinstance(options, ExecRemoteAwaitableOptions) else None
    try:
        with anyio.fail_after(timeout):
            async for event in proc:
                if isinstance(event, ExecStdout):
                    stdout.write(event.data.encode("utf-8"))
                elif isinstance(event, ExecStderr):
                    stderr.write(event.data.encode("utf-8"))
                else:
                    return ExecResult[str](
                        success=event.success,
                        returncode=event.exit_code,
                        stdout=_text(stdout),
                        stderr=_text(stderr),
                    )
    except TimeoutError:
        with anyio.CancelScope(shield=True):
            await proc.kill()
        raise
    return ExecResult[str](success=False, returncode=-1, stdout=_text(stdout), stderr=_text(stderr))


def _text(buffer: CircularByteBuffer) -> str:
    return buffer.getvalue().decode("utf-8", errors="replace")
