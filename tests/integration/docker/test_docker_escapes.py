"""The escape catalogue, as root in a Docker sandbox, under no-network and allowlist."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import anyio
import pytest

from corral import EnvironmentSession, ExecutionPlan, NetworkSchedule
from corral.providers.docker import DockerEnvironment
from corral.providers.docker.session import DockerSession
from corral.testing.escapes import (
    EscapeTargets,
    catalogue,
    escapes,
    failed_controls,
    forge_through_the_relay,
)
from corral.testing.plugin import EgressTarget
from corral.testing.servers import serve_tcp, stop_server
from tests.integration.conftest import (
    ALLOWED_IP,
    DENIED_IP,
    DENIED_IP6,
    LINK_LOCAL_IP,
    TCP_PORT,
    UDP_PORT,
)
from tests.integration.docker.conftest import TEST_IMAGE, make_env

pytestmark = pytest.mark.anyio
PEER_PORT = 9000


@pytest.fixture(scope="module")
def listeners(target_link: None) -> Iterator[dict[str, int]]:
    """Host listeners: the denied IPv6 address, the link-local one, and every address."""
    servers = {
        "v6": serve_tcp(DENIED_IP6),
        "link-local": serve_tcp(LINK_LOCAL_IP),
        "host": serve_tcp("0.0.0.0"),
    }
    yield {name: server.getsockname()[1] for name, (server, _) in servers.items()}
    for pair in servers.values():
        stop_server(*pair)


@pytest.fixture
def ipv6_env(owner: str, runtime: str) -> DockerEnvironment:
    """Under each runtime (`RUNTIMES`): runsc behind a gateway, which routes no IPv6 (its
    own test in test_docker_enforcement shows that)."""
    return make_env(owner, ipv6_pool="fd00:c0ff:ee00::/48", runtime=runtime)


@pytest.fixture
async def peer(ipv6_env: DockerEnvironment) -> AsyncIterator[DockerSession]:
    """Another sandbox, listening on PEER_PORT."""
    async with ipv6_env.session(ExecutionPlan(image=TEST_IMAGE)) as other:
        assert isinstance(other, DockerSession)
        await other.exec(["sh", "-c", f"nohup nc -lk -p {PEER_PORT} >/dev/null 2>&1 &"])
        yield other


async def targets(
    sandbox: EnvironmentSession, peer: DockerSession, ports: dict[str, int], runtime: str
) -> EscapeTargets:
    assert isinstance(sandbox, DockerSession)
    gvisor = runtime == "runsc"
    resolv = await sandbox.exec(["awk", "/^nameserver/ {print $2; exit}", "/etc/resolv.conf"])
    return EscapeTargets(
        denied_ip=DENIED_IP,
        denied_ip6="" if gvisor else DENIED_IP6,
        port=TCP_PORT,
        port6=ports["v6"],
        udp_port=UDP_PORT,
        link_local_ip=LINK_LOCAL_IP,
        link_local_port=ports["link-local"],
        host_ip=str(sandbox.net.gateway),
        host_port=ports["host"],
        peer_ip=peer.net.address,
        peer_port=PEER_PORT,
        resolver=resolv.stdout.strip() or str(sandbox.net.dns[0]),
        own_kernel=gvisor,
    )


def plan(policy: str) -> ExecutionPlan:
    return ExecutionPlan(
        image=TEST_IMAGE, network=NetworkSchedule.model_validate({"baseline": policy})
    )


async def test_the_catalogue_has_at_least_25_techniques() -> None:
    names = [t.name for t in catalogue(EscapeTargets("", "", 1, 1, 1, "", 1, "", 1, "", 1, ""))]
    assert len(names) == len(set(names)) >= 25


async def test_dialling_techniques_reach_their_targets_under_public(
    ipv6_env: DockerEnvironment,
    peer: DockerSession,
    listeners: dict[str, int],
    udp_targets: list[EgressTarget],
    runtime: str,
) -> None:
    async with ipv6_env.session(plan("public")) as sandbox:
        failed = await failed_controls(sandbox, await targets(sandbox, peer, listeners, runtime))
    assert failed == {}, "these techniques prove nothing: they fail even under public"


@pytest.mark.parametrize("policy", ["no-network", f"allowlist:{ALLOWED_IP}:{TCP_PORT}"])
async def test_no_technique_escapes(
    ipv6_env: DockerEnvironment,
    peer: DockerSession,
    listeners: dict[str, int],
    udp_targets: list[EgressTarget],
    policy: str,
    runtime: str,
) -> None:
    async with ipv6_env.session(plan(policy)) as sandbox:
        with anyio.fail_after(600):
            escaped = await escapes(sandbox, await targets(sandbox, peer, listeners, runtime))
        if policy.startswith("allowlist"):
            allowed = await sandbox.exec(["nc", "-z", "-w", "3", ALLOWED_IP, str(TCP_PORT)])
            assert allowed.returncode == 0, "the allowlist's own target must stay reachable"
    assert escaped == {}


async def test_forged_frames_on_the_relays_stdout_never_reach_a_result(
    routed_env: DockerEnvironment,
) -> None:
    # Issue 40: on 29fb870 the next shell result was the workload's bytes.
    async with routed_env.session(ExecutionPlan(image=TEST_IMAGE)) as sandbox:
        assert await forge_through_the_relay(sandbox) is None
