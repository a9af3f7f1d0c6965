"""A fault-injecting HTTP/1.1 proxy in front of an engine's API: the part every engine shares.

The proxy forwards each request to the upstream, except the one chosen to fail: it
answers that one with a 500, drops the connection, or stalls it, without the upstream
ever seeing it. Every request is recorded (method and route), so a test can count the
calls an operation makes, aim a fault at the n-th (of all calls, or of the calls equal to
`fault_on`), and see whether a call was sent again (a retry). `drop_all()` stands in for
the upstream going away (a restart): every open connection is cut, upgraded streams
included, and new ones are refused until `back()`.

HTTP/1.1 clients send a request only once the previous answer is read, so requests are
parsed on the way in and answers are piped back unparsed; a request that upgrades the
connection (exec and attach streams) turns it into a raw pipe both ways.

A subclass says where the proxy listens (`_bind`), what an accepted connection is
(`_accepted`, e.g. TLS terminated), how it reaches the upstream (`_connect`), and what
route a request path is (`_route`).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

Action = Literal["error", "drop", "stall"]
_ERROR_BODY = b'{"message":"fault injected by corral.testing"}'
_ERROR = (
    b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_ERROR_BODY), _ERROR_BODY)
)


class Conn(Protocol):
    """What the proxy needs of a connection: a socket, or TLS over one."""

    def recv(self, bufsize: int, /) -> bytes: ...
    def sendall(self, data: bytes, /) -> None: ...
    def shutdown(self, how: int, /) -> None: ...


@dataclass(frozen=True)
class Call:
    method: str
    route: str  # the path as the subclass abstracts it (no version, no query, no names)

    def __str__(self) -> str:
        return f"{self.method} {self.route}"


@dataclass
class FaultProxy:
    """Fails call number `fault_at` (1-based; counting only calls equal to `fault_on`
    when given) with `action`; every other call goes through."""

    fault_at: int | None = None
    action: Action = "error"
    fault_on: Call | None = None
    stall_s: float = 3600.0
    calls: list[Call] = field(default_factory=list[Call])
    #: The call the fault hit, once it has.
    faulted: Call | None = None
    _matching: int = 0
    _listener: socket.socket | None = None
    _threads: list[threading.Thread] = field(default_factory=list[threading.Thread])
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closing: threading.Event = field(default_factory=threading.Event)
    _sockets: set[socket.socket] = field(default_factory=set[socket.socket])

    # What a subclass provides.
    def _bind(self) -> socket.socket:
        """A listening socket (the same address each time: `back()` binds again)."""
        raise NotImplementedError

    def _accepted(self, sock: socket.socket) -> Conn:
        return sock

    def _connect(self) -> tuple[socket.socket, Conn]:
        """A connection to the upstream: the socket (to cut) and what to talk through."""
        raise NotImplementedError

    def _route(self, path: str) -> str:
        raise NotImplementedError

    def _remove_files(self) -> None:
        """Remove what `start` made on disk."""

    # The proxy.
    def start(self) -> FaultProxy:
        self._listen()
        return self

    def close(self) -> None:
        self._closing.set()
        self._cut(listener=True)
        for thread in self._threads:
            thread.join(timeout=10)
        self._remove_files()

    def drop_all(self) -> None:
        """The upstream goes away: cut every open connection (upgraded streams too) and
        refuse new ones until `back()`."""
        self._cut(listener=True)

    def back(self) -> None:
        """Accept connections again after `drop_all()`."""
        self._listen()

    def record(self, call: Call) -> bool:
        """Record `call`; whether it is the one to fail."""
        with self._lock:
            self.calls.append(call)
            if self.fault_on is not None and call != self.fault_on:
                return False
            self._matching += 1
            if self._matching != self.fault_at:
                return False
            self.faulted = call
            return True

    def _listen(self) -> None:
        listener = self._bind()
        with self._lock:
            self._listener = listener
        self._spawn(self._accept, listener)

    def _cut(self, *, listener: bool) -> None:
        with self._lock:
            everything = list(self._sockets)
            if listener and self._listener is not None:
                everything.append(self._listener)
                self._listener = None
        for sock in everything:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _track(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._sockets.add(sock)
        return sock

    def _accept(self, listener: socket.socket) -> None:
        while not self._closing.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            self._spawn(self._serve, self._track(client))

    def _serve(self, raw: socket.socket) -> None:
        upstream: Conn | None = None
        raw_upstream: socket.socket | None = None
        try:
            client = self._accepted(raw)
            reader = _Reader(client)
            while not self._closing.is_set():
                request = reader.request()
                if request is None:
                    return
                head, body, method, path, upgrade = request
                if self.record(Call(method, self._route(path))):
                    if self.action == "error":
                        client.sendall(_ERROR)
                        continue
                    if self.action == "stall":
                        self._closing.wait(self.stall_s)
                    return
                if upstream is None:
                    raw_upstream, upstream = self._connect()
                    self._track(raw_upstream)
                    self._spawn(_pipe, upstream, client)
                upstream.sendall(head + body)
                if upgrade:
                    _pipe(client, upstream, reader.pending())
                    return
        except OSError:
            return
        finally:
            for sock in (raw, raw_upstream):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                    with self._lock:
                        self._sockets.discard(sock)


class _Reader:
    """Reads HTTP/1.1 requests off a connection, keeping what arrived past the last one."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self.buffer = b""

    def pending(self) -> bytes:
        data, self.buffer = self.buffer, b""
        return data

    def _fill(self) -> bool:
        data = self.conn.recv(65536)
        self.buffer += data
        return bool(data)

    def _until(self, marker: bytes) -> bytes | None:
        while marker not in self.buffer:
            if not self._fill():
                return None
        part, self.buffer = self.buffer.split(marker, 1)
        return part + marker

    def _exactly(self, n: int) -> bytes | None:
        while len(self.buffer) < n:
            if not self._fill():
                return None
        part, self.buffer = self.buffer[:n], self.buffer[n:]
        return part

    def request(self) -> tuple[bytes, bytes, str, str, bool] | None:
        head = self._until(b"\r\n\r\n")
        if head is None:
            return None
        lines = head.decode("latin-1").split("\r\n")
        method, path = lines[0].split(" ")[:2]
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)
        }
        body = b""
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = self._until(b"\r\n")
                if size_line is None:
                    return None
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                chunk = self._exactly(size + 2)
                if chunk is None:
                    return None
                body += size_line + chunk
                if size == 0:
                    break
        elif "content-length" in headers:
            data = self._exactly(int(headers["content-length"]))
            if data is None:
                return None
            body = data
        upgrade = "upgrade" in headers.get("connection", "").lower()
        return head, body, method, path, upgrade


def _pipe(source: Conn, sink: Conn, first: bytes = b"") -> None:
    try:
        if first:
            sink.sendall(first)
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
