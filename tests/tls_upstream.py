"""An HTTPS upstream on this host's loopback for credential-route tests, its certificate
from a throwaway CA (a route's `ca_file`); the unit and the Docker tests serve their own
handlers on it."""

from __future__ import annotations

import http.server
import ssl
import subprocess
import threading
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest


@contextmanager
def tls_upstream(
    handler: type[http.server.BaseHTTPRequestHandler], directory: Path
) -> Generator[tuple[int, Path]]:
    """(port, CA file) of `handler` served over TLS on 127.0.0.1 until the block ends."""
    (directory / "san").write_text("subjectAltName=IP:127.0.0.1\n")
    for argv in (
        "req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 1 -subj /CN=test-ca",
        "req -newkey rsa:2048 -nodes -keyout srv.key -out srv.csr -subj /CN=127.0.0.1",
        "x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out srv.pem -days 1 "
        "-extfile san",
    ):
        subprocess.run(["openssl", *argv.split()], cwd=directory, check=True, capture_output=True)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(directory / "srv.pem", directory / "srv.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], directory / "ca.pem"
    finally:
        server.shutdown()
        thread.join()


class QuietHandler(http.server.BaseHTTPRequestHandler):
    """A handler that logs nothing and answers in one call."""

    def answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def upstream_fixture(handler: type[http.server.BaseHTTPRequestHandler]) -> Any:
    """A module-scoped fixture serving `handler` with `tls_upstream`: (port, CA file)."""

    @pytest.fixture(scope="module")
    def upstream(tmp_path_factory: pytest.TempPathFactory) -> Generator[tuple[int, Path]]:
        with tls_upstream(handler, tmp_path_factory.mktemp("ca")) as served:
            yield served

    return upstream
