"""Egress targets shared by the Docker and Kubernetes integration tests.

TCP and UDP servers bound to addresses on a veth pair that the test session creates on
this host (and removes by its exact name): sandboxes reach them through their gateway,
as they would reach any outside host, and nothing leaves the machine.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from collections.abc import Iterator

import pytest

from corral.testing.plugin import EgressTarget
from corral.testing.servers import serve_tcp, stop_server

# Unique per test process, so that concurrent runs on one host never share a target.
_RUN = os.getpid() % 250 + 1
TARGET_LINK = f"corral-t{_RUN}"
ALLOWED_IP = f"10.214.{_RUN}.1"
DENIED_IP = f"10.214.{_RUN}.2"
HOSTS = {"allowed.corral.test": ALLOWED_IP, "denied.corral.test": DENIED_IP}


def unavailable(reason: str) -> None:
    """Fail in CI (which must provide the service), skip with the reason elsewhere."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI must provide it: .ci/run starts it)")
    pytest.skip(reason)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class UdpEcho:
    def __init__(self, host: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.port: int = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            try:
                data, peer = self.sock.recvfrom(2048)
            except OSError:
                return
            self.sock.sendto(b"echo:" + data, peer)

    def close(self) -> None:
        self.sock.close()
        self.thread.join(timeout=5)


@pytest.fixture(scope="session")
def target_link() -> Iterator[None]:
    # A veth pair (this kernel has no dummy links) whose addresses are local to the host.
    _ip("link", "add", TARGET_LINK, "type", "veth", "peer", "name", f"{TARGET_LINK}p")
    try:
        for address in (ALLOWED_IP, DENIED_IP):
            _ip("addr", "add", f"{address}/32", "dev", TARGET_LINK)
        _ip("link", "set", TARGET_LINK, "up")
        _ip("link", "set", f"{TARGET_LINK}p", "up")
        yield
    finally:
        _ip("link", "del", TARGET_LINK)


@pytest.fixture(scope="session")
def tcp_targets(target_link: None) -> Iterator[list[EgressTarget]]:
    servers = [serve_tcp(ALLOWED_IP), serve_tcp(DENIED_IP)]
    yield [EgressTarget(s.getsockname()[0], s.getsockname()[1]) for s, _ in servers]
    for server, thread in servers:
        stop_server(server, thread)


@pytest.fixture(scope="session")
def udp_targets(target_link: None) -> Iterator[list[UdpEcho]]:
    servers = [UdpEcho(ALLOWED_IP), UdpEcho(DENIED_IP)]
    yield servers
    for server in servers:
        server.close()
