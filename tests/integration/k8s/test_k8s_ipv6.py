"""IPv6 is a way out too: kube-router (as tests/integration/cluster/ runs it, like many
CNIs) polices IPv4 only, and every Pod has a link-local address. An agent learns its
gateway's MAC from one IPv4 dial, derives the node's fe80:: address (EUI-64) and reaches
whatever listens on the node's `::`. Here the listener is the test's own, on this host
(the node), IPv6 only, on a port of its own, closed when the test ends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from corral import ExecutionPlan, NetworkPolicy, NetworkPolicyNotEnforced, NetworkSchedule
from corral.providers.k8s.session import KubernetesSession
from corral.testing.servers import serve_tcp, stop_server
from tests.integration.k8s.conftest import TEST_IMAGE, make_env

pytestmark = pytest.mark.anyio

GREETING = b"ok\n"  # serve_tcp's
# argv: the node's IPv4 address, the listener's port. One IPv4 dial (refused or not) has
# the Pod resolve its gateway's MAC; each resolved neighbour's EUI-64 link-local address
# is then dialled on the Pod's link. Prints how many it derived, then what answered.
ATTACK = r"""
import socket, sys
node, port = sys.argv[1], int(sys.argv[2])
try:
    socket.create_connection((node, port), 2).close()
except OSError:
    pass
derived, reached = 0, []
for line in open("/proc/net/arp").read().splitlines()[1:]:
    f = line.split()
    if len(f) != 6 or not int(f[2], 16) & 2:
        continue
    mac = bytes.fromhex(f[3].replace(":", ""))
    eui = bytes([mac[0] ^ 2]) + mac[1:3] + b"\xff\xfe" + mac[3:]
    address = socket.inet_ntop(socket.AF_INET6, b"\xfe\x80" + bytes(6) + eui)
    derived += 1
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.settimeout(3)
            s.connect((address, port, 0, socket.if_nametoindex(f[5])))
            reached.append(f"{address}%{f[5]} {s.recv(64)!r}")
    except OSError:
        pass
print(derived)
print("\n".join(reached))
"""


@pytest.fixture
def node_listener() -> Iterator[int]:
    """A listener on this host's `::` (IPv6 only: `create_server` sets IPV6_V6ONLY) that
    answers GREETING; its port."""
    server, thread = serve_tcp("::")
    try:
        yield server.getsockname()[1]
    finally:
        stop_server(server, thread)


async def _attack(session: KubernetesSession, node: str, port: int) -> tuple[int, str]:
    result = await session.exec(["python3", "-c", ATTACK, node, str(port)], timeout=60)
    assert result.ok, result.stderr
    derived, _, reached = result.stdout.partition("\n")
    return int(derived), reached.strip()


def _plan(policy: NetworkPolicy) -> ExecutionPlan:
    return ExecutionPlan(image=TEST_IMAGE, network=NetworkSchedule(baseline=policy))


async def _node(session: KubernetesSession, cluster: Any) -> str:
    pod: Any = cluster.core.read_namespaced_pod(session.target.pod, session.target.namespace)
    return pod.status.host_ip


async def test_no_network_does_not_reach_the_node_over_ipv6(
    cluster: Any, namespace: str, node_listener: int
) -> None:
    # The control: with IPv6 left on (and nothing to police), the same steps reach it.
    env = make_env(namespace, disable_ipv6=False)
    async with env.session(_plan(NetworkPolicy.public())) as open_:
        assert isinstance(open_, KubernetesSession)
        derived, reached = await _attack(open_, await _node(open_, cluster), node_listener)
        assert derived >= 1 and GREETING.decode().strip() in reached, (derived, reached)

    async with make_env(namespace).session(_plan(NetworkPolicy.no_network())) as closed:
        assert isinstance(closed, KubernetesSession)
        derived, reached = await _attack(closed, await _node(closed, cluster), node_listener)
        assert derived >= 1 and reached == "", reached


async def test_a_gvisor_sandbox_has_no_ipv6_either(
    namespace: str, runtime_classes: dict[str, str | None]
) -> None:
    """gVisor's netstack shows no neighbours in /proc/net/arp, so the derivation above has
    nothing to start from there; what holds is that no link but loopback has IPv6."""
    env = make_env(namespace, runtime_class_name=runtime_classes["gvisor"])
    async with env.session(_plan(NetworkPolicy.no_network())) as session:
        links = await session.exec(["cat", "/proc/net/if_inet6"])
        assert links.ok, links.stderr
        assert [line.split()[-1] for line in links.stdout.splitlines()] in ([], ["lo"])


async def test_the_probe_reports_a_policy_that_leaks_over_ipv6(
    namespace: str, node_listener: int
) -> None:
    """IPv6 left on, where kube-router does not police it: the probe dials the node's
    link-local address on its probe port and refuses to call the policy verified."""
    env = make_env(namespace, disable_ipv6=False, probe_port=node_listener, verify_timeout_s=3)
    with pytest.raises(NetworkPolicyNotEnforced, match=rf"fe80::.*%eth0\]?:{node_listener}.*IPv6"):
        async with env.session(_plan(NetworkPolicy.no_network())):
            pass
