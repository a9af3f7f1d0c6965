"""TlsConn: TLS through memory BIOs, read in one thread while written in another."""

from __future__ import annotations

import shutil
import socket
import ssl
import threading
from pathlib import Path

import pytest

from corral.testing.api_faults import TlsConn, _throwaway_ca  # pyright: ignore[reportPrivateUsage]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_both_directions_at_once(tmp_path: Path) -> None:
    ca = _throwaway_ca(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    client_ctx = ssl.create_default_context(cafile=str(ca))
    left, right = socket.socketpair()
    conns: dict[str, TlsConn] = {}
    accept = threading.Thread(
        target=lambda: conns.setdefault("server", TlsConn(left, server_ctx, server_side=True))
    )
    accept.start()
    client = TlsConn(right, client_ctx, server_side=False, server_hostname="127.0.0.1")
    accept.join(10)
    server = conns["server"]
    payload = bytes(range(256)) * 4096  # 1 MiB each way, at the same time

    def send(conn: TlsConn) -> None:
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)

    def receive(conn: TlsConn, into: list[bytes]) -> None:
        while data := conn.recv(65536):
            into.append(data)

    got: dict[str, list[bytes]] = {"server": [], "client": []}
    threads = [
        threading.Thread(target=send, args=(client,)),
        threading.Thread(target=send, args=(server,)),
        threading.Thread(target=receive, args=(server, got["server"])),
        threading.Thread(target=receive, args=(client, got["client"])),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert b"".join(got["server"]) == payload
    assert b"".join(got["client"]) == payload
    left.close()
    right.close()
