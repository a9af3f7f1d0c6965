"""Fixtures for the Docker integration tests: a real engine and real images."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import docker
import pytest
from docker.errors import ImageNotFound

from corral.core.labels import OWNER
from corral.network.link import HOLDER_SIDE
from corral.network.wildcard import RESOLVER
from corral.providers.docker import DockerConfig, DockerEnvironment
from corral.testing.plugin import EgressTarget
from tests.integration.conftest import ALLOWED_IP as ALLOWED_IP
from tests.integration.conftest import DENIED_IP as DENIED_IP
from tests.integration.conftest import HOSTS, made, unavailable
from tests.integration.k8s.dns_server import serving

#: What the tests' upstream DNS server (`upstream`) answers; nothing else knows these names.
#: A test may repoint a name for its duration (the server reads the table per query).
NAMES = {
    "a.allowed.test": ALLOWED_IP,
    "b.allowed.test": ALLOWED_IP,
    "x.other.test": DENIED_IP,
    "moving.allowed.test": ALLOWED_IP,
}

TEST_IMAGE = "corral.local/test:bookworm"
HOLDER_IMAGE = "corral.local/holder:bookworm"


@pytest.fixture(scope="session")
def engine() -> Iterator[Any]:
    try:
        client: Any = docker.from_env(timeout=10)
        client.ping()
    except Exception as exc:
        unavailable(
            f"no Docker Engine answers ({exc}); start one with "
            "`bash tests/integration/docker/engine.sh up`"
        )
        raise
    for image in (TEST_IMAGE, HOLDER_IMAGE):
        try:
            client.images.get(image)
        except ImageNotFound:
            unavailable(f"image {image} missing; run `bash tests/integration/images/build.sh`")
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
    volumes = engine.volumes.list(filters=selector)
    for leftover in containers:
        leftover.remove(force=True)
    for leftover in networks:
        leftover.remove()
    for leftover in volumes:
        leftover.remove(force=True)
    assert not containers and not networks and not volumes, (
        f"leaked: {[c.name for c in containers]} {[n.name for n in networks]} "
        f"{[v.name for v in volumes]}"
    )


def containers(engine: Any, owner: str) -> dict[str, dict[str, str]]:
    """`owner`'s containers, running or not, by name, with their labels."""
    # The low-level list: the high-level one inspects each, racing their auto-removal.
    listed = engine.api.containers(all=True, filters={"label": f"{OWNER}={owner}"})
    return {c["Names"][0].lstrip("/"): c["Labels"] for c in listed}


def networks(engine: Any, owner: str) -> list[str]:
    return [n.name for n in engine.networks.list(filters={"label": f"{OWNER}={owner}"})]


def volumes(engine: Any, owner: str) -> list[str]:
    return [v.name for v in engine.volumes.list(filters={"label": f"{OWNER}={owner}"})]


def leftovers(engine: Any, owner: str) -> list[str]:
    return [*containers(engine, owner), *networks(engine, owner), *volumes(engine, owner)]


def env_config(owner: str, **overrides: Any) -> dict[str, Any]:
    """The test config of a `docker` environment, as JSON-ready parameters."""
    return {
        "owner": owner,
        "holder_image": HOLDER_IMAGE,
        "pull_policy": "never",
        "extra_hosts": HOSTS,
        **overrides,
    }


def make_env(owner: str, **overrides: Any) -> DockerEnvironment:
    return made(DockerEnvironment(DockerConfig.model_validate(env_config(owner, **overrides))))


@pytest.fixture
def docker_env(owner: str) -> DockerEnvironment:
    return make_env(owner)


#: The runtimes the enforcement, escape and event tests run under: runc shares the holder's
#: namespace; runsc (gVisor, registered by engine.sh) has a network stack of its own and
#: sits behind the holder as its gateway (`providers.docker.gateway`).
RUNTIMES = ["runc", "runsc"]


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest, engine: Any) -> str:
    name: str = request.param
    if name not in (engine.info().get("Runtimes") or {}):
        unavailable(f"no Docker runtime {name!r}: run tests/integration/docker/engine.sh up")
    return name


def nameservers(runtime: str) -> tuple[str, str]:
    """The sandbox's nameserver under Docker's resolver and under corral's: in its own
    namespace (runc), or the holder's end of a gateway's link, which answers for both."""
    if runtime == "runsc":
        return str(HOLDER_SIDE), str(HOLDER_SIDE)
    return "127.0.0.11", str(RESOLVER)


@pytest.fixture
def routed_env(owner: str, runtime: str) -> DockerEnvironment:
    """The test environment under each of `RUNTIMES`."""
    return make_env(owner, runtime=runtime)


@pytest.fixture(scope="module")
def upstream(tcp_targets: list[EgressTarget]) -> Iterator[str]:
    """A DNS server of the test's own (tests/integration/k8s/dns_server.py, TCP, A records
    from NAMES) on this run's allowed host address: the upstream resolver for corral's
    resolver. It shares its address with an allowed name on purpose: reaching that
    address on another port must not reach the resolver."""
    with serving(ALLOWED_IP, NAMES):
        yield ALLOWED_IP
