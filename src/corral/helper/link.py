"""One framed byte stream to a program of corral's in the sandbox, shared by the exec
channel (`channel.py`) and the process manager's client (`procs.py`).

Frames, both ways: `u32 length | u8 kind | u32 id | payload` (length counts kind, id and
payload). A `Transport` carries the bytes (Docker: the engine's hijacked exec socket;
Kubernetes: the exec websocket; `local`: a child's pipes); one reader thread per link
parses what arrives and hands each frame, on the event loop, to the mailbox of its id.
What arrives is read as hostile input: frames are bounded, a malformed one breaks the
link, never the harness, and so does one its protocol does not allow (`_admit`: for an
id never asked for, past a window, after an end), so what a mailbox holds is bounded
by the protocol, never by the far side's good manners.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import struct
import threading
import time
from typing import Any, ClassVar, Protocol, TypeVar

import anyio
import anyio.from_thread
import anyio.to_thread
from anyio.lowlevel import EventLoopToken
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from corral.core.blocking import run_blocking
from corral.errors import ProviderError

#: the largest frame either side sends is a 32 KiB chunk; anything far larger is garbage
MAX_FRAME = 1 << 20
HELLO_TIMEOUT_S = 10.0
#: bytes a second one link's reader takes from the sandbox past its burst, of what no
#: caller keeps (`FrameLink.keep`): a sandbox that floods its output costs the harness (and
#: the engine's copies of the stream) no more than that, whatever its own pace; what it
#: writes beyond waits in its pipes
READ_RATE = 8 * 1024 * 1024
READ_BURST = 16 * 1024 * 1024
#: bytes of the far side's own diagnostics (its stderr, the stream's status) kept
DIAGNOSTICS = 2048
_HEADER = struct.Struct(">IBI")


class ChannelUnavailable(Exception):
    """The program could not be started here; the message says why."""


class ProtocolError(Exception):
    pass


class Transport(Protocol):
    """The byte stream to one running program: its stdin one way, its stdout the other."""

    def recv(self) -> bytes:
        """Blocking: the next bytes the program wrote on its stdout; b"" once the stream
        ended. Called from the link's one reader thread only. Raises OSError (or
        ValueError, ProtocolError) when the stream fails."""
        ...

    def send(self, data: bytes) -> None:
        """Blocking, from any thread: `data` to the program's stdin, all of it, in order.
        Raises OSError once the stream is shut or broken."""
        ...

    def shutdown(self) -> None:
        """Stop the stream: `recv` returns b"" soon after and `send` raises; the program,
        its stdin closed, ends what it owns on this stream. Never blocks."""
        ...

    def close(self) -> None:
        """Release the stream (called by the reader thread once it leaves)."""
        ...

    def diagnostics(self) -> str:
        """What the program or the stream's far side said on the way out (bounded)."""
        ...


def frame(kind: str, rid: int, payload: bytes = b"") -> bytes:
    return _HEADER.pack(5 + len(payload), ord(kind), rid) + payload


class Pace:
    """A token bucket the reader thread spends each read from: past the burst, it sleeps
    (off the event loop) until the rate allows the bytes it took."""

    def __init__(self, rate: float = READ_RATE, burst: float = READ_BURST) -> None:
        self.rate, self.burst = rate, burst
        self._tokens = burst
        self._at = time.monotonic()

    def spend(self, size: int) -> float:
        """Takes `size` bytes; the seconds to wait before the next read."""
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate) - size
        self._at = now
        return max(0.0, -self._tokens / self.rate)


class FrameParser:
    """The program's frames out of its stdout bytes, as they arrive."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        self._buffer += data
        frames: list[tuple[int, int, bytes]] = []
        while len(self._buffer) >= _HEADER.size:
            size, kind, rid = _HEADER.unpack_from(self._buffer)
            if size < 5 or size > MAX_FRAME:
                raise ProtocolError(f"frame of {size} bytes: {self.head()!r}")
            if len(self._buffer) < 4 + size:
                break
            frames.append((kind, rid, bytes(self._buffer[_HEADER.size : 4 + size])))
            del self._buffer[: 4 + size]
        return frames

    def head(self) -> bytes:
        return bytes(self._buffer[:120])


Message = tuple[int, bytes]  # (kind, payload); kind 0: the link broke (payload: why)


def merged(
    frames: list[tuple[int, int, bytes]], kinds: frozenset[int]
) -> list[tuple[int, int, bytes]]:
    """`frames` with each run of consecutive frames of one id and one of `kinds` joined into
    one: a command printing 1 MiB arrives as some 34 frames, and each one handed to its
    mailbox is a pass of the event loop."""
    runs: list[tuple[int, int, list[bytes]]] = []
    for kind, rid, payload in frames:
        if runs and kind in kinds and runs[-1][:2] == (kind, rid):
            runs[-1][2].append(payload)
        else:
            runs.append((kind, rid, [payload]))
    return [(kind, rid, b"".join(parts)) for kind, rid, parts in runs]


class FrameLink:
    """One running program and the stream to it: requests out, each id's frames into its
    own mailbox."""

    #: the protocol version the program's hello must carry
    version: ClassVar[int]
    #: kinds whose consecutive frames of one id are one stream of bytes (see `merged`)
    streamed: ClassVar[frozenset[int]] = frozenset()

    def __init__(
        self, transport: Transport, token: EventLoopToken, key: str, tokens: int, sandbox_id: str
    ) -> None:
        self.transport = transport
        self.token = token
        #: the limiter (`core.blocking`) its blocking writes run under
        self.key = key
        self.tokens = tokens
        self.dead: str | None = None
        self.hello: dict[str, Any] = {}
        self.ids = itertools.count(1)
        self._boxes: dict[int, MemoryObjectSendStream[Message]] = {}
        #: the highest id a mailbox was opened for: a frame for a higher one is a lie
        self._asked = 0
        self._parser = FrameParser()
        self._pace = Pace()
        #: bytes of each id's output its caller keeps, which the reader takes unpaced
        self._kept: dict[int, int] = {}
        self._kept_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.sandbox_id = sandbox_id

    # -- the reader thread: blocking reads, delivered to the loop in batches --------------

    def start_reader(self) -> None:
        self._thread = threading.Thread(
            # Named for its session, which it lives as long as (see testing.leftovers).
            target=self._read_loop,
            name=f"corral-exec-channel-{self.sandbox_id}",
            daemon=True,
        )
        self._thread.start()

    def _read_loop(self) -> None:
        reason = "the helper's stream ended"
        try:
            while True:
                data = self.transport.recv()
                if not data:
                    break
                parsed = self._parser.feed(data)
                paced = self._unkept(parsed)
                frames = merged(parsed, self.streamed)
                if frames:
                    anyio.from_thread.run_sync(self._deliver, frames, token=self.token)
                time.sleep(self._pace.spend(paced))
        except ProtocolError as exc:
            reason = f"the helper spoke nonsense ({exc})"
        except (OSError, ValueError) as exc:
            reason = f"the helper's stream failed: {exc}"
        except RuntimeError:
            return  # the event loop is gone, and every caller with it
        finally:
            with contextlib.suppress(OSError):
                self.transport.close()
        diagnostics = self.transport.diagnostics()
        if diagnostics:
            reason = f"{reason}: {diagnostics}"
        with contextlib.suppress(RuntimeError):
            anyio.from_thread.run_sync(self._broken, reason, token=self.token)

    def _deliver(self, frames: list[tuple[int, int, bytes]]) -> None:
        for kind, rid, payload in frames:
            box = self._boxes.get(rid)
            if box is None and rid <= self._asked:
                continue  # a late frame for a call given up: nothing waits for it
            violation = (
                f"a frame for id {rid}, which was never asked for"
                if box is None
                else self._admit(rid, kind, payload)
            )
            if box is None or violation is not None:
                self._broken(f"the helper broke the protocol: {violation}")
                self.close()
                return
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                box.send_nowait((kind, payload))

    def _admit(self, rid: int, kind: int, payload: bytes) -> str | None:
        """Why the protocol does not allow this frame into the open mailbox of `rid`, or
        None. On the event loop, before the frame is queued."""
        return None

    def _broken(self, reason: str) -> None:
        if self.dead is None:
            self.dead = reason
        for box in self._boxes.values():
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                box.send_nowait((0, reason.encode()))

    def close(self) -> None:
        """Stop using this program: its stream is shut, so it ends what it owns on this
        stream; the reader thread sees the end and leaves. Never blocks."""
        if self.dead is None:
            self.dead = "closed"
        with contextlib.suppress(OSError):
            self.transport.shutdown()

    async def join(self, timeout_s: float) -> None:
        """Wait (off the loop, which the reader may still need once) for the reader thread
        to leave after `close`."""
        thread = self._thread
        if thread is not None:
            await anyio.to_thread.run_sync(thread.join, timeout_s)

    # -- the event loop side ---------------------------------------------------------------

    def open_box(self, rid: int) -> MemoryObjectReceiveStream[Message]:
        # Unbounded here: what a box may hold is bounded by the protocol, which `_admit`
        # enforces (a reply, or a window).
        send, receive = anyio.create_memory_object_stream[Message](math.inf)
        self._boxes[rid] = send
        self._asked = max(self._asked, rid)
        if self.dead is not None:
            send.send_nowait((0, self.dead.encode()))
        return receive

    def keep(self, rid: int, size: int) -> None:
        """`rid`'s caller keeps `size` bytes of its output: the reader takes that much at
        full speed, and paces only what goes beyond (what a truncation only counts)."""
        with self._kept_lock:
            self._kept[rid] = size

    def _unkept(self, frames: list[tuple[int, int, bytes]]) -> int:
        """The bytes of `frames` to pace: every header, and every payload byte past what
        its id's caller keeps (spent from it here)."""
        paced = 0
        with self._kept_lock:
            for kind, rid, payload in frames:
                left = self._kept.get(rid, 0) if kind in self.streamed else 0
                taken = min(left, len(payload))
                if taken:
                    self._kept[rid] = left - taken
                paced += _HEADER.size + len(payload) - taken
        return paced

    def close_box(self, rid: int, receive: MemoryObjectReceiveStream[Message]) -> None:
        with self._kept_lock:
            self._kept.pop(rid, None)
        box = self._boxes.pop(rid, None)
        if box is not None:
            box.close()
        receive.close()

    async def write(self, data: bytes) -> None:
        try:
            await run_blocking(self.key, self.tokens, self.transport.send, data)
        except OSError as exc:
            reason = self.dead or exc  # a link shut for a broken protocol says so
            self.close()
            raise ProviderError(f"the exec channel broke: {reason}") from None

    async def await_hello(self) -> None:
        receive = self.open_box(0)
        try:
            with anyio.fail_after(HELLO_TIMEOUT_S):
                kind, payload = await receive.receive()
        except TimeoutError:
            raise ChannelUnavailable("the helper did not answer") from None
        finally:
            self.close_box(0, receive)
        if kind != ord("H"):
            raise ChannelUnavailable(payload.decode(errors="replace") or "no hello")
        try:
            hello = json.loads(payload)
        except ValueError:
            raise ChannelUnavailable(f"a malformed hello: {payload[:120]!r}") from None
        if not isinstance(hello, dict) or hello.get("version") != self.version:  # pyright: ignore[reportUnknownMemberType]
            raise ChannelUnavailable(f"a helper of another version: {payload[:120]!r}")
        self.hello = dict(hello)  # pyright: ignore[reportUnknownArgumentType]


L = TypeVar("L", bound=FrameLink)


async def greeted(link: L) -> L:
    """`link` with its reader running, once its program said hello; closed, and
    ChannelUnavailable saying why, when it does not."""
    link.start_reader()
    try:
        await link.await_hello()
    except BaseException as exc:
        link.close()
        if isinstance(exc, ChannelUnavailable) and link.dead not in (None, "closed"):
            raise ChannelUnavailable(f"{exc}: {link.dead}") from None
        raise
    return link
