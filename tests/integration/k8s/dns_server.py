"""A DNS-over-TCP server for the tests: A records from a table, nothing else.

It stands for the cluster's resolver (the test cluster has no cluster DNS): it answers
each length-framed query on a connection until the client half-closes, like a real one.
"""

from __future__ import annotations

import ipaddress
import socket
import socketserver
import struct
import threading
from collections.abc import Generator, Mapping
from contextlib import contextmanager

_A, _IN = 1, 1


def _question(message: bytes) -> tuple[str, int, int]:
    """(name, qtype, offset past the question) of a query."""
    labels: list[str] = []
    offset = 12
    while message[offset]:
        length = message[offset]
        labels.append(message[offset + 1 : offset + 1 + length].decode("ascii").lower())
        offset += 1 + length
    qtype = struct.unpack(">H", message[offset + 1 : offset + 3])[0]
    return ".".join(labels), qtype, offset + 5


def answer(query: bytes, table: Mapping[str, str]) -> bytes:
    name, qtype, end = _question(query)
    (qid,) = struct.unpack(">H", query[:2])
    address = table.get(name)
    records = b""
    if address is not None and qtype == _A:
        rdata = ipaddress.IPv4Address(address).packed
        records = struct.pack(">HHHIH", 0xC00C, _A, _IN, 60, len(rdata)) + rdata
    rcode = 0 if address is not None else 3
    header = struct.pack(">HHHHHH", qid, 0x8180 | rcode, 1, 1 if records else 0, 0, 0)
    return header + query[12:end] + records


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return b""
        data += chunk
    return data


@contextmanager
def serving(address: str, table: Mapping[str, str]) -> Generator[None]:
    """Serve `table` on `address`:53/tcp while the block runs."""

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            sock: socket.socket = self.request
            while (framed := _read(sock, 2)) and (
                query := _read(sock, *struct.unpack(">H", framed))
            ):
                reply = answer(query, table)
                sock.sendall(struct.pack(">H", len(reply)) + reply)

    class Server(socketserver.ThreadingTCPServer):
        allow_reuse_address = True
        daemon_threads = True

    server = Server((address, 53), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
