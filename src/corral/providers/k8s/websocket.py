"""A Kubernetes streaming websocket after its handshake: exec's or port-forward's frames,
read and written here without the kubernetes client's buffering or its threads.

The websocket is driven by one thread, the one that calls `recv`, which both reads and
writes: an SSL socket must not be read and written from two threads at once (OpenSSL
forbids it), so `send` from any other thread queues its frames and waits for that thread
to flush them. The wait is on an epoll selector, never `select()`: a harness with a
thousand sandboxes has descriptors above 1024 (the kubernetes client's own port-forward
proxy fails there with "filedescriptor out of range in select()").

The connection itself is opened by `api.Clients.websocket`. Plain exec reads every channel
through `exchange`, writing its stdin between reads; the exec channel and port-forward
read one channel through `recv`.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import ssl
import threading
from dataclasses import dataclass

from kubernetes.stream.ws_client import (
    CLOSE_CHANNEL,
    ERROR_CHANNEL,
    STDERR_CHANNEL,
    STDOUT_CHANNEL,
    V5_CHANNEL_PROTOCOL,
)
from websocket import ABNF, WebSocket

from corral.helper.link import DIAGNOSTICS, ProtocolError

#: bytes read from, or written to, the socket at once
IO_CHUNK = 64 * 1024
#: a websocket frame from the API server larger than this is garbage
MAX_WS_FRAME = 16 << 20
#: the payload of one websocket frame corral sends
FRAME = 1024 * 1024


@dataclass(frozen=True)
class Channels:
    """Which websocket channel carries what, in one streaming protocol."""

    #: where `send` writes
    outgoing: int
    #: what `recv` returns
    incoming: int
    #: kept for `diagnostics()`, in this order
    diagnostics: tuple[int, ...]
    #: channels whose first bytes name the port (port-forward's v4 protocol), not data
    port_prefixed: tuple[int, ...] = ()


#: exec: stdin out, stdout in, stderr and the status kept
EXEC = Channels(0, STDOUT_CHANNEL, (STDERR_CHANNEL, ERROR_CHANNEL))
#: port-forward of one port: data both ways on 0, errors on 1; each opens with the port
PORT_FORWARD = Channels(0, 0, (1,), port_prefixed=(0, 1))
_PORT_PREFIX = 2


def framed(head: bytes, data: bytes) -> bytes:
    """`data` as the client's binary frames on the channel `head` names, each masked as
    RFC 6455 requires of a client (websocket-client's masking, in Python)."""
    return b"".join(
        ABNF.create_frame(head + data[i : i + FRAME], ABNF.OPCODE_BINARY).format()
        for i in range(0, len(data), FRAME)
    )


class WebSocketTransport:
    """The websocket after its handshake, driven by the thread that calls `recv`."""

    def __init__(self, ws: WebSocket, channels: Channels = EXEC) -> None:
        self._ws = ws
        self._channels = channels
        self._head = bytes([channels.outgoing])
        if ws.sock is None:
            raise OSError("the websocket is not connected")
        self._sock: socket.socket = ws.sock
        self._sock.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._selector.register(self._sock, selectors.EVENT_READ)
        self._cond = threading.Condition()
        self._outgoing = bytearray()
        self._queued = 0  # bytes ever queued
        self._sent = 0  # bytes ever written to the socket
        self._shut = False
        self._failed: str | None = None
        self._ended = False
        self._incoming = bytearray()
        self._continued: int | None = None  # the channel of a fragmented message
        self._kept = {channel: bytearray() for channel in channels.diagnostics}
        self._prefix = dict.fromkeys(channels.port_prefixed, _PORT_PREFIX)

    # -- any thread --------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        frames = framed(self._head, data)
        with self._cond:
            if self._shut or self._failed is not None:
                raise OSError(f"the stream is {self._failed or 'shut'}")
            self._outgoing += frames
            self._queued += len(frames)
            target = self._queued
        self._wake()
        with self._cond:
            while self._sent < target and not self._shut and self._failed is None:
                self._cond.wait()
            if self._sent < target:
                raise OSError(f"the stream is {self._failed or 'shut'}")

    def shutdown(self) -> None:
        with self._cond:
            self._shut = True
            self._cond.notify_all()
        self._wake()

    def diagnostics(self) -> str:
        parts = (bytes(kept).decode(errors="replace").strip() for kept in self._kept.values())
        return "; ".join(p for p in parts if p)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    # -- the reader thread only -----------------------------------------------------------------

    def recv(self) -> bytes:
        """The incoming channel's next bytes; b"" once the stream ended or was shut."""
        while True:
            frames = self.exchange(None)
            if frames is None:
                return b""
            incoming = bytearray()
            for channel, body in frames:
                if channel == self._channels.incoming:
                    incoming += body
                elif (kept := self._kept.get(channel)) is not None and len(kept) < DIAGNOSTICS:
                    kept += body[: DIAGNOSTICS - len(kept)]
            if incoming:
                return bytes(incoming)

    def queue(self, data: bytes) -> None:
        """`data` for the outgoing channel, written while this thread reads (`exchange`):
        a peer that writes before it reads never waits on us, nor we on it."""
        self._queue(framed(self._head, data))

    def queue_close(self) -> None:
        """The outgoing channel's end (v5's CLOSE signal; v4 has none), after what is
        queued."""
        if self._ws.getsubprotocol() == V5_CHANNEL_PROTOCOL:
            frame = bytes([CLOSE_CHANNEL, self._channels.outgoing])
            self._queue(ABNF.create_frame(frame, ABNF.OPCODE_BINARY).format())

    def backlog(self) -> int:
        """Bytes queued and not yet written."""
        with self._cond:
            return len(self._outgoing)

    def exchange(self, timeout: float | None) -> list[tuple[int, bytes]] | None:
        """One round: write what is queued, read what has come, each without blocking;
        if neither could, wait up to `timeout` (None: until one can). The (channel, bytes)
        of the data frames read, possibly none; None once the stream ended or was shut."""
        with self._cond:
            if self._shut or self._ended:
                return None
            pending = bytes(self._outgoing[:IO_CHUNK])
        wrote = 0
        if pending:
            # Retried with the same leading bytes, as OpenSSL requires after a WANT.
            with contextlib.suppress(BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                wrote = self._sock.send(pending)
            if wrote:
                with self._cond:
                    del self._outgoing[:wrote]
                    self._sent += wrote
                    self._cond.notify_all()
        data: bytes | None = None
        with contextlib.suppress(BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            data = self._sock.recv(IO_CHUNK)
        if data == b"":
            return None
        if data is not None:
            return self._parse(data)
        if not wrote:
            self._wait(timeout)
        return []

    def _wait(self, timeout: float | None) -> None:
        with self._cond:
            writing = bool(self._outgoing)
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if writing else 0)
        self._selector.modify(self._sock, events)
        for key, _ in self._selector.select(timeout):
            if key.fileobj is self._wake_r:
                with contextlib.suppress(BlockingIOError):
                    while self._wake_r.recv(4096):
                        pass

    def _queue(self, frame: bytes) -> None:
        with self._cond:
            self._outgoing += frame
            self._queued += len(frame)

    def _parse(self, data: bytes) -> list[tuple[int, bytes]]:
        """The (channel, bytes) of the data frames `data` completes."""
        self._incoming += data
        frames: list[tuple[int, bytes]] = []
        buffer = self._incoming
        while len(buffer) >= 2:
            fin, opcode = buffer[0] & 0x80, buffer[0] & 0x0F
            size, start = buffer[1] & 0x7F, 2
            if size == 126:
                if len(buffer) < 4:
                    break
                size, start = int.from_bytes(buffer[2:4], "big"), 4
            elif size == 127:
                if len(buffer) < 10:
                    break
                size, start = int.from_bytes(buffer[2:10], "big"), 10
            masked = buffer[1] & 0x80
            if size > MAX_WS_FRAME:
                raise ProtocolError(f"a websocket frame of {size} bytes")
            end = start + (4 if masked else 0) + size
            if len(buffer) < end:
                break
            payload = bytes(buffer[end - size : end])
            if masked:
                payload = ABNF.mask(bytes(buffer[start : start + 4]), payload)
            del buffer[:end]
            if opcode == ABNF.OPCODE_PING:
                self._queue(ABNF.create_frame(payload, ABNF.OPCODE_PONG).format())
            elif opcode == ABNF.OPCODE_CLOSE:
                self._ended = True
                break
            elif opcode in (ABNF.OPCODE_TEXT, ABNF.OPCODE_BINARY) and payload:
                channel, body = payload[0], payload[1:]
                self._continued = None if fin else channel
                frames.append((channel, self._unprefixed(channel, body)))
            elif opcode == ABNF.OPCODE_CONT and self._continued is not None:
                channel = self._continued
                if fin:
                    self._continued = None
                frames.append((channel, self._unprefixed(channel, payload)))
        return [(channel, body) for channel, body in frames if body]

    def _unprefixed(self, channel: int, body: bytes) -> bytes:
        skip = self._prefix.get(channel, 0)
        if skip:
            self._prefix[channel] = skip - min(skip, len(body))
            body = body[skip:]
        return body

    def close(self) -> None:
        with self._cond:
            if self._failed is None:
                self._failed = "closed"
            self._cond.notify_all()
        self._selector.close()
        for sock in (self._sock, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                sock.close()
