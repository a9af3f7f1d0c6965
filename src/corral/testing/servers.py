"""Throwaway TCP listeners used as egress targets by the conformance suite and the demo."""

from __future__ import annotations

import contextlib
import socket
import threading


def serve_tcp(host: str = "127.0.0.1") -> tuple[socket.socket, threading.Thread]:
    """A listener on `host` (IPv4 or IPv6) that accepts, answers `ok` and closes, until its
    socket closes; a client that hangs up first does not stop it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server = socket.create_server((host, 0), family=family)

    def loop() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):
                conn.sendall(b"ok\n")

    thread = threading.Thread(target=loop, daemon=True, name="corral-egress-target")
    thread.start()
    return server, thread


def stop_server(server: socket.socket, thread: threading.Thread) -> None:
    # shutdown() wakes the thread blocked in accept(); close() alone would not.
    with contextlib.suppress(OSError):
        server.shutdown(socket.SHUT_RDWR)
    server.close()
    thread.join(timeout=5)
