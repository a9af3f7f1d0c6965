"""The escape catalogue, as root in a Kubernetes sandbox, under no-network and allowlist,
with runc and with gVisor (whose own network stack's packets still meet the CNI's rules)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest

from corral import ExecutionPlan, NetworkSchedule
from corral.providers.k8s import KubernetesEnvironment
from corral.providers.k8s.session import KubernetesSession
from corral.testing.escapes import (
    EscapeTargets,
    escapes,
    failed_controls,
    forge_through_the_relay,
)
from corral.testing.plugin import EgressTarget
from corral.testing.servers import serve_tcp, stop_server
from tests.integration.conftest import ALLOWED_IP, DENIED_IP, LINK_LOCAL_IP, TCP_PORT, UDP_PORT
from tests.integration.k8s.conftest import RUNTIME_CLASSES, TEST_IMAGE

pytestmark = pytest.mark.anyio
PEER_PORT = 9000


@pytest.fixture(scope="module")
def listeners(target_link: None) -> Iterator[dict[str, int]]:
    """Host listeners: the link-local test address, and every address of the node."""
    servers = {
        "link-local": serve_tcp(LINK_LOCAL_IP),
        "host": serve_tcp("0.0.0.0"),
    }
    yield {name: server.getsockname()[1] for name, (server, _) in servers.items()}
    for pair in servers.values():
        stop_server(*pair)


def plan(policy: str) -> ExecutionPlan:
    schedule = NetworkSchedule.model_validate({"baseline": policy})
    return ExecutionPlan(image=TEST_IMAGE, network=schedule)


@pytest.fixture
async def peer(k8s_env: KubernetesEnvironment) -> AsyncIterator[KubernetesSession]:
    """Another sandbox, listening on PEER_PORT."""
    async with k8s_env.session(plan("public")) as other:
        assert isinstance(other, KubernetesSession)
        await other.exec(["sh", "-c", f"nohup nc -lk -p {PEER_PORT} >/dev/null 2>&1 &"])
        yield other


def pod(cluster: Any, session: KubernetesSession) -> Any:
    return cluster.core.read_namespaced_pod(session.target.pod, session.target.namespace)


async def targets(
    cluster: Any, sandbox: KubernetesSession, peer: KubernetesSession, ports: dict[str, int]
) -> EscapeTargets:
    resolv = await sandbox.exec(
        ["sh", "-c", "awk '/^nameserver/ {print $2; exit}' /etc/resolv.conf"]
    )
    spec = pod(cluster, sandbox)
    return EscapeTargets(
        denied_ip=DENIED_IP,
        denied_ip6="",  # the test cluster's Pods have no IPv6 address
        port=TCP_PORT,
        port6=0,
        udp_port=UDP_PORT,
        link_local_ip=LINK_LOCAL_IP,
        link_local_port=ports["link-local"],
        host_ip=spec.status.host_ip,
        host_port=ports["host"],
        peer_ip=pod(cluster, peer).status.pod_ip,
        peer_port=PEER_PORT,
        resolver=resolv.stdout.strip() or "10.96.0.10",
        own_kernel=spec.spec.runtime_class_name == RUNTIME_CLASSES["gvisor"],
    )


async def test_dialling_techniques_reach_their_targets_under_public(
    cluster: Any,
    runtime_env: KubernetesEnvironment,
    peer: KubernetesSession,
    listeners: dict[str, int],
    tcp_targets: list[EgressTarget],
    udp_targets: list[EgressTarget],
) -> None:
    async with runtime_env.session(plan("public")) as sandbox:
        assert isinstance(sandbox, KubernetesSession)
        failed = await failed_controls(sandbox, await targets(cluster, sandbox, peer, listeners))
    # A Pod has neither NET_RAW nor a ping_group_range that admits it: it cannot send ICMP
    # under any policy, so that technique is out of its reach, not merely untested.
    assert failed.keys() <= {"icmp-ping"}, "these techniques fail even under public"
    assert "Operation not permitted" in failed.get("icmp-ping", "Operation not permitted")


@pytest.mark.parametrize("policy", ["no-network", f"allowlist:{ALLOWED_IP}:{TCP_PORT}"])
async def test_no_technique_escapes(
    cluster: Any,
    runtime_env: KubernetesEnvironment,
    peer: KubernetesSession,
    listeners: dict[str, int],
    tcp_targets: list[EgressTarget],
    udp_targets: list[EgressTarget],
    policy: str,
) -> None:
    async with runtime_env.session(plan(policy)) as sandbox:
        assert isinstance(sandbox, KubernetesSession)
        with anyio.fail_after(600):
            escaped = await escapes(sandbox, await targets(cluster, sandbox, peer, listeners))
        if policy.startswith("allowlist"):
            allowed = await sandbox.exec(["nc", "-z", "-w", "3", ALLOWED_IP, str(TCP_PORT)])
            assert allowed.returncode == 0, "the allowlist's own target must stay reachable"
    assert escaped == {}


async def test_forged_frames_on_the_relays_stdout_never_reach_a_result(
    runtime_env: KubernetesEnvironment,
) -> None:
    # Issue 40: on 29fb870 the next shell result was the workload's bytes.
    async with runtime_env.session(ExecutionPlan(image=TEST_IMAGE)) as sandbox:
        assert await forge_through_the_relay(sandbox) is None
