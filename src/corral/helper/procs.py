"""The client of corral's process manager (`corral-exec --procs…`, `helper/procs.go`):
background processes on every provider through one protocol.

The manager runs beside the sandbox's processes and holds them: it spawns each (argv,
cwd, env, user, stdin, a pty, an fd 3 for a persistent shell's status), keeps its output
in a bounded ring, its exit status, and serves several connections at once. On Docker and
Kubernetes it is a daemon inside the sandbox, reached by one exec stream per harness
connection (`--procs SID` relays the stream to it), so another harness process reaches
the same processes; on `local` it is a child of the harness (`--procs-stdio`), killing
what it holds when the harness goes. Frames as in `link.py`; the kinds:

corral -> manager: `S` start, `A` attach (output from an offset, within a window), `W`
more window, `D` detach, `I` stdin bytes, `C` close stdin, `G` signal, `K` kill the tree,
`Z` resize the terminal, `L` list. manager -> corral: `H` hello (its `epoch`), `Y` done
(with a reply), `F` refused, and on an attach's id: `B` where the output resumes, `o`,
`e`, `t` (stdout, stderr, fd 3) bytes, `X` the exit.

A process id is `<epoch>-<n>`: the manager's random epoch and a number it never reuses,
so an id from a manager that is gone (ended with the sandbox's workload) never reaches
another process. The manager lives where the workload can reach it: what it says is the
workload's own output, and nothing corral decides is read from it.
"""

from __future__ import annotations

import contextlib
import json
import struct
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
from anyio.lowlevel import EventLoopToken, current_token
from anyio.streams.memory import MemoryObjectReceiveStream

from corral.core.markers import MARKER, new_marker
from corral.core.processes import (
    KILLED,
    Gap,
    Item,
    ProcessExited,
    ProcessInfo,
    PtySize,
    StartRequest,
    StreamKind,
)
from corral.errors import ConfigError, ProcessNotFound, ProviderError, RemotePathNotFound
from corral.helper.link import FrameLink, Message, Transport, frame

VERSION = 2
#: bytes of one process's output a reader may have in flight to the harness
WINDOW = 256 * 1024
#: bytes of stdin per frame
STDIN_CHUNK = 256 * 1024
#: seconds a cancelled start waits to learn what to kill
START_REPLY_S = 10.0
#: seconds `aclose` waits for the reader thread
CLOSE_WAIT_S = 5.0
_STREAMS: dict[int, StreamKind] = {ord("o"): "stdout", ord("e"): "stderr", ord("t"): "status"}
#: `B`s an attach may get in a row: the manager says a gap again when its buffer ran
#: past the reader while it sent the last one, as it does on a slow link; each is ~150
#: bytes queued, so a run this long is well under 1 MiB
GAPS_IN_A_ROW = 4096
#: an attach ends with its exit, a refusal, or the answer to its detach
_ATTACH_ENDS = frozenset(b"XFY")


class _Window:
    """What an attach may still receive: `left` bytes of output, at most `GAPS_IN_A_ROW`
    `B`s between two frames of output, nothing after its end."""

    def __init__(self, left: int) -> None:
        self.left = left
        self._gaps = 0
        self._ended = False

    def grant(self, size: int) -> None:
        self.left += size

    def admit(self, rid: int, kind: int, payload: bytes) -> str | None:
        """Why attach `rid` may not receive this frame, or None (and it is counted)."""
        if self._ended:
            return f"{chr(kind)!r} on attach {rid} after its end"
        if kind in _STREAMS:
            if not 0 < len(payload) <= self.left:
                return f"{len(payload)} bytes on attach {rid}, {self.left} left of its window"
            self.left -= len(payload)
            self._gaps = 0
        elif kind == ord("B") and self._gaps < GAPS_IN_A_ROW:
            self._gaps += 1
        elif kind in _ATTACH_ENDS:
            self._ended = True
        else:
            return f"{chr(kind)!r} on attach {rid}"
        return None


class ProcessLink(FrameLink):
    """One connection to a process manager, which lives where the workload reaches it:
    every mailbox holds what the protocol allows and no more. A call's holds one reply;
    an attach's at most the window granted (`WINDOW`, then each `W`), its frames each
    carrying output, a few `B`s between them. Anything else ends the link."""

    version = VERSION
    streamed = frozenset(_STREAMS)

    def __init__(
        self, transport: Transport, token: EventLoopToken, key: str, tokens: int, sandbox_id: str
    ) -> None:
        super().__init__(transport, token, key, tokens, sandbox_id)
        self._windows: dict[int, _Window] = {}
        self._answered: set[int] = set()

    @property
    def epoch(self) -> str:
        return str(self.hello.get("epoch", ""))

    def open_attach(self, rid: int) -> MemoryObjectReceiveStream[Message]:
        self._windows[rid] = _Window(WINDOW)
        return self.open_box(rid)

    def grant(self, rid: int, size: int) -> None:
        """`size` more bytes for attach `rid`: before the `W` that says so goes out."""
        window = self._windows.get(rid)
        if window is not None:
            window.grant(size)

    def close_box(self, rid: int, receive: MemoryObjectReceiveStream[Message]) -> None:
        self._windows.pop(rid, None)
        self._answered.discard(rid)
        super().close_box(rid, receive)

    def _admit(self, rid: int, kind: int, payload: bytes) -> str | None:
        window = self._windows.get(rid)
        if window is not None:
            return window.admit(rid, kind, payload)
        if rid in self._answered:
            return f"a second reply on id {rid}"
        self._answered.add(rid)
        return None


#: how a provider connects: a started link that said hello, or ProviderError
Connect = Callable[[EventLoopToken], Awaitable[ProcessLink]]
#: how a provider places a start: the spec's argv, cwd, env, user and as_self
Place = Callable[[StartRequest], dict[str, Any]]


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        raise ProviderError(f"the process manager said nonsense: {data[:120]!r}") from None


class _Exited(ProcessNotFound):
    """The process has exited: a signal or a resize reaches nothing, and is no error."""


def _refused(id: str, data: bytes) -> Exception:
    said: Any = _json(data)
    fields: dict[str, Any] = said if isinstance(said, dict) else {"message": repr(data[:200])}  # pyright: ignore[reportUnknownVariableType]
    kind, message = str(fields.get("kind", "")), str(fields.get("message", ""))
    missing = any(said in message.lower() for said in ("not found", "no such file"))
    if kind == "cwd" or (kind == "program" and missing):
        return RemotePathNotFound(message)
    if kind == "program":
        return ConfigError(f"cannot start {id!r}: {message}")
    if kind == "user":
        return ConfigError(f"cannot start {id}: {message}")
    if kind == "exited":
        return _Exited(f"process {id!r} has exited")
    if kind == "proc":
        return ProcessNotFound(f"process {id!r} is not held by its sandbox: {message}")
    if kind in ("stdin", "pty"):
        return ConfigError(f"process {id!r}: {message}")
    return ProviderError(f"the process manager refused ({id}): {message}")


class _Subscription:
    """An attach's frames as `Item`s, the window given back as they are taken."""

    def __init__(self, link: ProcessLink, rid: int, box: MemoryObjectReceiveStream[Message]):
        self.link, self.rid, self.box = link, rid, box
        self.done = False
        self._taken = 0

    def __aiter__(self) -> _Subscription:
        return self

    async def __anext__(self) -> Item:
        if self.done:
            raise StopAsyncIteration
        kind, payload = await self.box.receive()
        stream = _STREAMS.get(kind)
        if stream is not None:
            self._taken += len(payload)
            if self._taken >= WINDOW // 2:
                grant = json.dumps({"bytes": self._taken}).encode()
                self.link.grant(self.rid, self._taken)
                self._taken = 0
                await self.link.write(frame("W", self.rid, grant))
            return (stream, payload)
        if kind == ord("B"):
            resumed = _json(payload)
            try:
                return Gap(offset=int(resumed["offset"]), dropped=int(resumed["dropped"]))
            except (KeyError, TypeError, ValueError):
                raise ProviderError(
                    f"the process manager said nonsense: {payload[:120]!r}"
                ) from None
        self.done = True
        if kind == ord("X"):
            exit_info = _json(payload)
            return ProcessExited(returncode=exit_info.get("code"), signal=exit_info.get("signal"))
        if kind == ord("F"):
            raise _refused(f"attach {self.rid}", payload)
        raise ProviderError(f"the process manager's stream broke: {payload.decode()}")


class ProcessClient:
    """The `ProcessManager` of one sandbox (or service): connected on first use, again
    after the stream breaks, forgetting its processes when the workload is ended."""

    def __init__(self, connect: Connect, place: Place, *, sandbox_id: str) -> None:
        self._connect = connect
        self._place = place
        self.sandbox_id = sandbox_id
        self._link: ProcessLink | None = None
        self._lock = anyio.Lock()
        #: epochs of managers the sandbox's end took with every process they held
        self._ended: set[str] = set()

    async def _connected(self) -> ProcessLink:
        async with self._lock:
            link, token = self._link, current_token()
            if link is not None and link.dead is None and link.token == token:
                return link
            if link is not None:
                link.close()
            self._link = await self._connect(token)
            return self._link

    async def _located(self, id: str) -> tuple[ProcessLink, int] | None:
        """The link and number of process `id`; None if the sandbox's end took it."""
        epoch, _, number = id.rpartition("-")
        if not epoch or not number.isdigit():
            raise ProcessNotFound(f"{id!r} is not a process id corral gives")
        if epoch in self._ended:
            return None
        link = await self._connected()
        if link.epoch != epoch:
            raise ProcessNotFound(
                f"process {id!r} belonged to a process manager that is gone (sandbox "
                f"{self.sandbox_id!r} now runs manager {link.epoch!r})"
            )
        return link, int(number)

    async def _request(self, link: ProcessLink, kind: str, payload: bytes, id: str) -> bytes:
        rid = next(link.ids)
        box = link.open_box(rid)
        try:
            await link.write(frame(kind, rid, payload))
            answer, data = await box.receive()
        finally:
            link.close_box(rid, box)
        if answer == ord("Y"):
            return data
        if answer == ord("F"):
            raise _refused(id, data)
        raise ProviderError(f"the process manager's stream broke: {data.decode()}")

    async def _call(self, id: str, kind: str, **fields: Any) -> None:
        located = await self._located(id)
        if located is None:
            raise ProcessNotFound(f"process {id!r} ended with the sandbox's workload")
        link, number = located
        await self._request(link, kind, json.dumps({"proc": number, **fields}).encode(), id)

    async def start(self, request: StartRequest) -> str:
        link = await self._connected()  # first: placing may use what connecting learnt
        marker = new_marker()
        spec: dict[str, Any] = {
            **self._place(request),
            "stdin": request.stdin,
            "pty": None if request.pty is None else request.pty.model_dump(),
            "status_fd": request.status_fd,
            "name": request.name or "",
            "marker": marker,
            "buffer": request.buffer_bytes,
            "command": list(request.args),  # what `list` shows, whatever wraps it
        }
        spec["env"] = [*spec["env"], f"{MARKER}={marker}"]
        rid = next(link.ids)
        box = link.open_box(rid)
        sent = False
        try:
            await link.write(frame("S", rid, json.dumps(spec).encode()))
            sent = True
            answer, data = await box.receive()
        except BaseException:
            if not sent:
                # A write raises before its thread sends a byte (a cancellation lands only
                # there), or after breaking the link, whose manager ends what it holds:
                # either way no answer will come.
                raise
            # Cancelled (or the stream failed) once the request is out: whatever it
            # started is killed before this returns.
            with anyio.CancelScope(shield=True), anyio.move_on_after(START_REPLY_S):
                answer, data = await box.receive()
                if answer == ord("Y"):
                    number = int(_json(data)["proc"])
                    with contextlib.suppress(ProviderError):
                        await self._request(
                            link, "K", json.dumps({"proc": number}).encode(), str(number)
                        )
            raise
        finally:
            link.close_box(rid, box)
        if answer == ord("F"):
            raise _refused(request.args[0], data)
        if answer != ord("Y"):
            raise ProviderError(f"the process manager's stream broke: {data.decode()}")
        return f"{link.epoch}-{int(_json(data)['proc'])}"

    @contextlib.asynccontextmanager
    async def attach(self, id: str, offset: int) -> AsyncGenerator[AsyncIterator[Item]]:
        located = await self._located(id)
        if located is None:
            yield _killed()
            return
        link, number = located
        rid = next(link.ids)
        box = link.open_attach(rid)
        subscription = _Subscription(link, rid, box)
        try:
            request = {"proc": number, "offset": offset, "window": WINDOW}
            await link.write(frame("A", rid, json.dumps(request).encode()))
            yield subscription
        finally:
            # Closed first: the manager answers a detach with `Y` even when the process's
            # exit already ended the attach (its `X` unread in the box), and that answer is
            # then a late frame for a call given up, not a second end.
            link.close_box(rid, box)
            if not subscription.done and link.dead is None:
                with anyio.CancelScope(shield=True), contextlib.suppress(ProviderError):
                    await link.write(frame("D", rid))

    async def write(self, id: str, data: bytes) -> None:
        located = await self._located(id)
        if located is None:
            raise ProcessNotFound(f"process {id!r} ended with the sandbox's workload")
        link, number = located
        for start in range(0, max(len(data), 1), STDIN_CHUNK):
            chunk = struct.pack(">I", number) + data[start : start + STDIN_CHUNK]
            await self._request(link, "I", chunk, id)

    async def close_stdin(self, id: str) -> None:
        await self._call(id, "C")

    async def signal(self, id: str, signum: int, *, spare_leader: bool = False) -> None:
        with contextlib.suppress(_Exited):
            await self._call(id, "G", signal=signum, spare_leader=spare_leader)

    async def kill(self, id: str) -> None:
        if await self._located(id) is not None:
            await self._call(id, "K")

    async def resize(self, id: str, size: PtySize) -> None:
        with contextlib.suppress(_Exited):
            await self._call(id, "Z", rows=size.rows, cols=size.cols)

    async def list(self) -> list[ProcessInfo]:
        link = await self._connected()
        listed = _json(await self._request(link, "L", b"{}", "list"))
        return [
            ProcessInfo(
                id=f"{link.epoch}-{entry['proc']}",
                name=entry.get("name") or None,
                command=tuple(entry.get("argv") or ()),
                started_at=entry["started_at"],
                running=bool(entry.get("running")),
                returncode=entry.get("code"),
                signal=entry.get("signal"),
            )
            for entry in listed
        ]

    def reset(self) -> None:
        """The sandbox's processes were all killed, the manager with them: their ids now
        report `KILLED`. Never blocks."""
        link, self._link = self._link, None
        if link is not None:
            if link.epoch:
                self._ended.add(link.epoch)
            link.close()

    async def aclose(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            link.close()
            await link.join(CLOSE_WAIT_S)


async def _killed() -> AsyncIterator[Item]:
    yield KILLED
