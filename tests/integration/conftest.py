"""Egress targets shared by the Docker and Kubernetes integration tests.

compose.yaml's target services (TCP and UDP servers) bound to addresses on a veth pair
that the test session creates on this host (and removes by its exact name): sandboxes
reach them through their gateway, as they would reach any outside host, and nothing
leaves the machine.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import anyio
import pytest

from corral import BaseEnvironment, EnvironmentSession
from corral.testing.plugin import EgressTarget

# Unique per test process, so that concurrent runs on one host never share a target.
_RUN = os.getpid() % 250 + 1
TARGET_LINK = f"corral-t{_RUN}"
ALLOWED_IP = f"10.214.{_RUN}.1"
DENIED_IP = f"10.214.{_RUN}.2"
ALLOWED_IP6 = f"fd00:214:{_RUN:x}::1"
DENIED_IP6 = f"fd00:214:{_RUN:x}::2"
# Link-local, like a cloud metadata address, but one this test run owns.
LINK_LOCAL_IP = f"169.254.214.{_RUN}"
HOSTS = {"allowed.corral.test": ALLOWED_IP, "denied.corral.test": DENIED_IP}


def unavailable(reason: str) -> None:
    """Fail in CI (which must provide the service), skip with the reason elsewhere."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI must provide it: .ci/run starts it)")
    pytest.skip(reason)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture(scope="session")
def target_link() -> Iterator[None]:
    # A veth pair (this kernel has no dummy links) whose addresses are local to the host.
    _ip("link", "add", TARGET_LINK, "type", "veth", "peer", "name", f"{TARGET_LINK}p")
    try:
        for address in (ALLOWED_IP, DENIED_IP, LINK_LOCAL_IP):
            _ip("addr", "add", f"{address}/32", "dev", TARGET_LINK)
        for address in (ALLOWED_IP6, DENIED_IP6):
            _ip("-6", "addr", "add", f"{address}/128", "dev", TARGET_LINK, "nodad")
        _ip("link", "set", TARGET_LINK, "up")
        _ip("link", "set", f"{TARGET_LINK}p", "up")
        yield
    finally:
        _ip("link", "del", TARGET_LINK)


TCP_PORT = 8080
UDP_PORT = 8081
COMPOSE = Path(__file__).parents[2] / "compose.yaml"


def _reachable(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=0.5).close()
    except OSError:
        return False
    return True


@pytest.fixture(scope="session")
def compose_targets(target_link: None) -> Iterator[None]:
    """compose.yaml's egress targets, bound to this run's host addresses."""
    if shutil.which("docker-compose") is None:
        unavailable("docker-compose is missing; `apt-get install docker-compose`")
    project = ["docker-compose", "-f", str(COMPOSE), "-p", f"corral-targets-{_RUN}"]
    env = {**os.environ, "CORRAL_TARGET_ALLOWED": ALLOWED_IP, "CORRAL_TARGET_DENIED": DENIED_IP}
    services = ["target-allowed", "target-denied"]
    subprocess.run([*project, "up", "-d", *services], check=True, env=env, capture_output=True)
    try:
        deadline = time.monotonic() + 60
        while not all(_reachable(a, TCP_PORT) for a in (ALLOWED_IP, DENIED_IP)):
            if time.monotonic() > deadline:
                raise RuntimeError("compose egress targets did not start listening in 60 s")
            time.sleep(0.2)
        yield
    finally:
        subprocess.run([*project, "down", "-t", "1"], env=env, capture_output=True, check=False)


@pytest.fixture(scope="session")
def tcp_targets(compose_targets: None) -> list[EgressTarget]:
    """TCP servers answering `ok`: the first allowed, the second denied by the tests."""
    return [EgressTarget(ALLOWED_IP, TCP_PORT), EgressTarget(DENIED_IP, TCP_PORT)]


@pytest.fixture(scope="session")
def udp_targets(compose_targets: None) -> list[EgressTarget]:
    """UDP echo servers (reply `echo:<data>`), on the same two addresses."""
    return [EgressTarget(ALLOWED_IP, UDP_PORT), EgressTarget(DENIED_IP, UDP_PORT)]


# Bits of /proc/<pid>/status CapEff (linux/capability.h) that the tests look for.
_CAPABILITY_BITS = {12: "NET_ADMIN", 13: "NET_RAW", 19: "SYS_PTRACE"}


async def effective_capabilities(sandbox: EnvironmentSession) -> frozenset[str]:
    """Which of the capabilities the tests look for a process in `sandbox` holds."""
    status = await sandbox.exec(["grep", "CapEff", "/proc/self/status"])
    bits = int(status.stdout.split()[1], 16)
    return frozenset(name for bit, name in _CAPABILITY_BITS.items() if bits & (1 << bit))


async def wait_for(condition: Callable[[], bool], until: float) -> float:
    """Poll until `condition` holds; the wall-clock time it first did, or fail at `until`."""
    while not condition():
        if time.time() > until:
            raise AssertionError(f"still not so {time.time() - until:.1f} s past the deadline")
        await anyio.sleep(0.25)
    return time.time()


#: environments made by the provider conftests' `make_env`, released after each test
MADE: list[BaseEnvironment] = []


E = TypeVar("E", bound=BaseEnvironment)


def made(env: E) -> E:
    MADE.append(env)
    return env


@pytest.fixture(autouse=True)
def release_environments() -> Iterator[None]:
    """Each environment a test made gives back its engine or API client after the test:
    otherwise the suite holds every test's connections until a full garbage collection
    (the test process passed 1024 descriptors)."""
    yield
    while MADE:
        # On a thread of its own: the test's event loop may still run in this one.
        closing = threading.Thread(target=anyio.run, args=(MADE.pop().aclose,))
        closing.start()
        closing.join()
