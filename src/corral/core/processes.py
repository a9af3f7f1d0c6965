"""Processes a session owns: started in the background, streamed, written to, signalled,
killed, and found again from another harness process.

`session.start(...)` returns a `Process` once the command runs in the sandbox. Its output
is kept on the sandbox's side, bounded (a ring per process, oldest bytes dropped first and
counted in `dropped_bytes`), so a reader that starts late, or a handle from
`session.process(id)` in another harness process, gets what is left. The harness holds at
most one window of a process's output per reader, whatever the process prints.

A provider serves processes through a `ProcessManager` (corral's helper on every
provider: `corral.helper.procs`); this module is the part every provider shares.
"""

from __future__ import annotations

import signal as signals
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Literal, Protocol

import anyio
from pydantic import BaseModel, ConfigDict, Field

from corral.errors import ConfigError

if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

#: bytes of output kept per process on the sandbox's side unless the session says otherwise
DEFAULT_BUFFER_BYTES = 1 << 20
#: the status stream of a persistent shell: what it writes on its fd 3, never the output
StreamKind = Literal["stdout", "stderr", "status"]


class PtySize(BaseModel):
    """A terminal's size, in character cells."""

    model_config = ConfigDict(frozen=True)

    rows: int = Field(default=24, ge=1, le=1000)
    cols: int = Field(default=80, ge=1, le=1000)


@dataclass(frozen=True)
class ProcessOutput:
    """Bytes a process wrote, as they came (a terminal's output is all `stdout`)."""

    stream: Literal["stdout", "stderr"]
    data: bytes


@dataclass(frozen=True)
class ProcessExited:
    """The end of a process: its exit code, or the signal that ended it."""

    returncode: int | None
    signal: int | None

    @property
    def code(self) -> int:
        """The exit code as a shell reports it: 128 + the signal's number after a signal."""
        if self.returncode is not None:
            return self.returncode
        return 128 + (self.signal or 0)


ProcessEvent = ProcessOutput | ProcessExited
#: what `end_workload` or a closed session reports for a process it killed
KILLED = ProcessExited(returncode=None, signal=int(signals.SIGKILL))


class ProcessInfo(BaseModel):
    """A process a session holds: running, or exited and still kept (with its output)."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str | None
    command: tuple[str, ...]
    started_at: datetime
    running: bool
    returncode: int | None = None
    signal: int | None = None


@dataclass(frozen=True)
class StartRequest:
    """One `session.start`, its arguments checked and normalized (as `ExecRequest` is for
    `exec`); where a relative `cwd` lands and which user None means is the provider's."""

    args: tuple[str, ...]
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict[str, str])
    user: str | None = None
    service: str | None = None
    stdin: bool = False
    pty: PtySize | None = None
    name: str | None = None
    #: bytes of output kept on the sandbox's side
    buffer_bytes: int = DEFAULT_BUFFER_BYTES
    #: a third stream, the process's fd 3 (the persistent shell's status)
    status_fd: bool = False


@dataclass(frozen=True)
class Gap:
    """Output the sandbox's ring let go before this reader got it: `dropped` bytes, the
    next chunk starting at `offset`."""

    offset: int
    dropped: int


Chunk = tuple[StreamKind, bytes]
Item = Chunk | Gap | ProcessExited


class ProcessManager(Protocol):
    """What a provider serves processes with (one per sandbox or service)."""

    async def start(self, request: StartRequest) -> str:
        """Start `request`; its id once it runs. Cancelled meanwhile: nothing is left."""
        ...

    def attach(self, id: str, offset: int) -> AbstractAsyncContextManager[AsyncIterator[Item]]:
        """The process's output from `offset` (a `Gap` first where the ring let some go),
        then its `ProcessExited`. An offset past the end starts at the end."""
        ...

    async def write(self, id: str, data: bytes) -> None: ...

    async def close_stdin(self, id: str) -> None: ...

    async def signal(self, id: str, signum: int, *, spare_leader: bool = False) -> None:
        """`signum` to the process's group (a terminal's: its foreground group); with
        `spare_leader`, to every other member of the group."""
        ...

    async def kill(self, id: str) -> None:
        """Kill its whole tree; return once it is reaped."""
        ...

    async def resize(self, id: str, size: PtySize) -> None: ...

    async def list(self) -> list[ProcessInfo]: ...


class Process:
    """A handle on a process a session started (`session.start`) or found
    (`session.process(id)`). Iterating it yields `ProcessOutput` and then exactly one
    `ProcessExited`; a second loop goes on from where the first stopped."""

    def __init__(
        self, manager: ProcessManager, id: str, *, name: str | None, stdin: bool, pty: bool
    ) -> None:
        self._manager = manager
        self.id = id
        self.name = name
        self._stdin = stdin
        self._pty = pty
        self._offset = 0
        #: output the sandbox's ring let go before this handle read it
        self.dropped_bytes = 0
        self._exited: ProcessExited | None = None

    def __repr__(self) -> str:
        return f"<Process id={self.id!r} name={self.name!r}>"

    def __aiter__(self) -> AsyncIterator[ProcessEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[ProcessEvent]:
        if self._exited is not None:
            yield self._exited
            return
        async with self._manager.attach(self.id, self._offset) as items:
            async for item in items:
                if isinstance(item, Gap):
                    self.dropped_bytes += item.dropped
                    self._offset = item.offset
                elif isinstance(item, ProcessExited):
                    self._exited = item
                    yield item
                    return
                else:
                    stream, data = item
                    self._offset += len(data)
                    if stream != "status":
                        yield ProcessOutput(stream, data)

    async def wait(self, timeout: float | None = None) -> int:
        """Its exit code (128 + n after signal n), without reading its output;
        `TimeoutError` after `timeout` seconds, the process left running."""
        with anyio.fail_after(timeout):
            if self._exited is None:
                async with self._manager.attach(self.id, 1 << 62) as items:
                    async for item in items:
                        if isinstance(item, ProcessExited):
                            self._exited = item
                            break
        assert self._exited is not None, f"process {self.id}'s output ended without its exit"
        return self._exited.code

    async def write(self, data: str | bytes) -> None:
        """Write to its stdin (or its terminal); returns once the process's pipe took it."""
        if not (self._stdin or self._pty):
            raise ConfigError(f"process {self.id!r} was started without stdin=True or a pty")
        await self._manager.write(self.id, data.encode() if isinstance(data, str) else data)

    async def close_stdin(self) -> None:
        if not self._stdin:
            raise ConfigError(f"process {self.id!r} was not started with stdin=True")
        await self._manager.close_stdin(self.id)

    async def signal(self, signum: int) -> None:
        """Send `signum` to its process group (with a pty: the terminal's foreground job)."""
        await self._manager.signal(self.id, int(signum))

    async def kill(self) -> None:
        """Kill its whole tree, whatever it forked or setsid'd; returns once it is gone."""
        await self._manager.kill(self.id)

    async def resize(self, rows: int, cols: int) -> None:
        if not self._pty:
            raise ConfigError(f"process {self.id!r} has no terminal (start it with pty=...)")
        await self._manager.resize(self.id, PtySize(rows=rows, cols=cols))
