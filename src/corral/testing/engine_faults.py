"""A fault-injecting proxy in front of the Docker Engine's API socket.

The proxy listens on a Unix socket of its own and forwards each HTTP request to the
engine, except the one chosen to fail: it answers that one with a 500, drops the
connection, or stalls it, without the engine ever seeing it. Every request is recorded
(method and route), so a test can count the calls an operation makes, aim a fault at the
n-th, and see whether a call was sent again (a retry).

HTTP/1.1 clients send a request only once the previous answer is read, so requests are
parsed on the way in and answers are piped back unparsed; a request that upgrades the
connection (exec and attach streams) turns it into a raw pipe both ways.
"""

from __future__ import annotations

import contextlib
import re
import socket
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Action = Literal["error", "drop", "stall"]
_VERSION = re.compile(r"^/v[0-9.]+")
_ERROR_BODY = b'{"message":"fault injected by corral.testing.engine_faults"}'
_ERROR = (
    b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_ERROR_BODY), _ERROR_BODY)
)


@dataclass(frozen=True)
class Call:
    method: str
    route: str  # the path without API version and query

    def __str__(self) -> str:
        return f"{self.method} {self.route}"


@dataclass
class EngineFaultProxy:
    """Forwards to `upstream`; fails request number `fault_at` (1-based) with `action`."""

    upstream: str = "/var/run/docker.sock"
    fault_at: int | None = None
    action: Action = "error"
    stall_s: float = 3600.0
    calls: list[Call] = field(default_factory=list[Call])
    _dir: Path | None = None
    _listener: socket.socket | None = None
    _threads: list[threading.Thread] = field(default_factory=list[threading.Thread])
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closing: threading.Event = field(default_factory=threading.Event)
    _sockets: set[socket.socket] = field(default_factory=set[socket.socket])

    @property
    def base_url(self) -> str:
        assert self._dir is not None, "start() first"
        return f"unix://{self._dir / 'engine.sock'}"

    @property
    def faulted(self) -> Call | None:
        """The call the fault hit, once it has."""
        at = self.fault_at
        return self.calls[at - 1] if at is not None and len(self.calls) >= at else None

    def start(self) -> EngineFaultProxy:
        self._dir = Path(tempfile.mkdtemp(prefix="corral-faults-"))
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self._dir / "engine.sock"))
        listener.listen(64)
        self._listener = listener
        self._spawn(self._accept)
        return self

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            everything = [*self._sockets, *([self._listener] if self._listener else [])]
        for sock in everything:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(timeout=10)
        if self._dir is not None:
            (self._dir / "engine.sock").unlink(missing_ok=True)
            self._dir.rmdir()

    def __enter__(self) -> EngineFaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _track(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._sockets.add(sock)
        return sock

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._spawn(self._serve, self._track(client))

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        reader = _Reader(client)
        try:
            while not self._closing.is_set():
                request = reader.request()
                if request is None:
                    return
                head, body, method, path, upgrade = request
                with self._lock:
                    self.calls.append(Call(method, _VERSION.sub("", path.split("?", 1)[0])))
                    number = len(self.calls)
                if number == self.fault_at:
                    if self.action == "error":
                        client.sendall(_ERROR)
                        continue
                    if self.action == "stall":
                        self._closing.wait(self.stall_s)
                    return
                if upstream is None:
                    upstream = self._track(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
                    upstream.connect(self.upstream)
                    self._spawn(_pipe, upstream, client)
                upstream.sendall(head + body)
                if upgrade:
                    _pipe(client, upstream, reader.pending())
                    return
        except OSError:
            return
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)


class _Reader:
    """Reads HTTP/1.1 requests off a socket, keeping what arrived past the last one."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def pending(self) -> bytes:
        data, self.buffer = self.buffer, b""
        return data

    def _fill(self) -> bool:
        data = self.sock.recv(65536)
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


def _pipe(source: socket.socket, sink: socket.socket, first: bytes = b"") -> None:
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
