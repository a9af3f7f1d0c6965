"""Fixtures for the Docker integration tests: a real engine, real images, real targets.

Egress targets are TCP and UDP servers bound to addresses on a dummy interface that the
session creates on this host (and removes by its exact name): sandboxes reach them
through their gateway, as they would reach any outside host, and nothing leaves the
machine.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import docker
import pytest
from docker.errors import ImageNotFound

from corral.core.labels import OWNER
from corral.providers.docker import DockerConfig, DockerEnvironment
from corral.testing.plugin import EgressTarget
from corral.testing.servers import serve_tcp, stop_server

TEST_IMAGE = "corral.local/test:bookworm"
HOLDER_IMAGE = "corral.local/holder:bookworm"
TARGET_LINK = "corral-tgt0"
ALLOWED_IP = "10.214.0.1"
DENIED_IP = "10.214.0.2"
HOSTS = {"allowed.corral.test": ALLOWED_IP, "denied.corral.test": DENIED_IP}


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI must provide it: .ci/run starts the engine)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def engine() -> Iterator[Any]:
    try:
        client: Any = docker.from_env(timeout=10)
        client.ping()
    except Exception as exc:
        _unavailable(
            f"no Docker Engine answers ({exc}); start one with "
            "`bash tests/integration/docker/engine.sh up`"
        )
        raise
    for image in (TEST_IMAGE, HOLDER_IMAGE):
        try:
            client.images.get(image)
        except ImageNotFound:
            _unavailable(f"image {image} missing; run `bash tests/integration/images/build.sh`")
    yield client
    client.close()


@pytest.fixture(scope="session")
def owner(engine: Any) -> Iterator[str]:
    """A label owner unique to this test run; nothing carrying it may survive the run."""
    value = f"corral-test-{secrets.token_hex(4)}"
    yield value
    selector = {"label": f"{OWNER}={value}"}
    containers = engine.containers.list(all=True, filters=selector)
    networks = engine.networks.list(filters=selector)
    for leftover in containers:
        leftover.remove(force=True)
    for leftover in networks:
        leftover.remove()
    assert not containers and not networks, (
        f"leaked: {[c.name for c in containers]} {[n.name for n in networks]}"
    )


def make_env(owner: str, **overrides: Any) -> DockerEnvironment:
    params: dict[str, Any] = {
        "owner": owner,
        "holder_image": HOLDER_IMAGE,
        "pull_policy": "never",
        "extra_hosts": HOSTS,
        **overrides,
    }
    return DockerEnvironment(DockerConfig.model_validate(params))


@pytest.fixture
def docker_env(owner: str) -> DockerEnvironment:
    return make_env(owner)


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
def target_link(engine: Any) -> Iterator[None]:
    # A veth pair (this kernel has no dummy links) whose addresses are local to the host.
    subprocess.run(["ip", "link", "del", TARGET_LINK], capture_output=True, check=False)
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
