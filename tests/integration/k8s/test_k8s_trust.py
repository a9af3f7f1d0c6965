"""Nothing corral decides on a k8s sandbox may depend on what the workload (root) can change.

The forbidden destination is made reachable without stopping the shared cluster's
enforcer: a NetworkPolicy of the test's own allows the sandbox Pod all egress, and
NetworkPolicies add up, so corral's `no-network` is then not in force, exactly as on a
CNI that fails open.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from corral import EnvironmentSession, NetworkPolicy, NetworkPolicyNotEnforced
from corral.testing.plugin import EgressTarget
from tests.integration.conftest import ALLOWED_IP, DENIED_IP
from tests.integration.k8s.conftest import PROBE_IMAGE, TEST_IMAGE, make_env
from tests.integration.k8s.dns_server import serving
from tests.integration.k8s.test_k8s_provider import objects, plan

pytestmark = pytest.mark.anyio

# Every dialler a probe could borrow from the sandbox, replaced by one that always
# "fails" (what the old probe read as: refused, so enforced).
_FORGE = (
    "for tool in nc netcat nc.openbsd nc.traditional wget curl busybox; do "
    'path=$(command -v "$tool") || continue; path=$(readlink -f "$path"); '
    'printf \'#!/bin/sh\\nexit 1\\n\' > "$path" && echo "forged $tool"; done'
)
# The workload's own connect, which does not go through the forged tools.
_CONNECT = "import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 3)"


async def connects(sandbox: EnvironmentSession, target: EgressTarget) -> bool:
    result = await sandbox.exec(["python3", "-c", _CONNECT, target.host, str(target.port)])
    return result.returncode == 0


@pytest.fixture
def open_door(cluster: Any, namespace: str) -> Iterator[Any]:
    """`open_door(session_id)`: a NetworkPolicy of the test's own allowing that session's
    Pod all egress; removed (by its exact name) at the end."""
    made: list[str] = []

    def open_for(session_id: str) -> None:
        name = f"test-open-door-{session_id}"
        body: dict[str, Any] = {
            "metadata": {"name": name},
            "spec": {
                "podSelector": {"matchLabels": {"corral.session": session_id}},
                "policyTypes": ["Egress"],
                "egress": [{}],
            },
        }
        cluster.networking.create_namespaced_network_policy(namespace, body)
        made.append(name)

    yield open_for
    for name in made:
        cluster.networking.delete_namespaced_network_policy(name, namespace)


@pytest.mark.parametrize(
    ("image", "forge"),
    [(TEST_IMAGE, True), (PROBE_IMAGE, False)],
    ids=["dialers-forged-by-root", "image-without-nc"],
)
async def test_probe_does_not_trust_the_sandbox(
    cluster: Any, namespace: str, open_door: Any, image: str, forge: bool
) -> None:
    """A policy that is not in force is caught though the sandbox's own `nc` would say
    "refused": the probe dials from corral's container, not with the workload's tools."""
    owner = f"untrusted-{'forged' if forge else 'nonc'}"
    env = make_env(namespace, owner=owner, verify_timeout_s=3)
    sandbox = await env.open(plan("public").model_copy(update={"image": image}))
    try:
        if forge:
            forged = await sandbox.exec(_FORGE)
            assert "forged nc" in forged.stdout, forged
        else:
            assert (await sandbox.exec("command -v nc")).returncode != 0, "the image has nc"
        open_door(sandbox.id)
        with pytest.raises(NetworkPolicyNotEnforced, match="does not enforce"):
            await sandbox.set_network_policy(NetworkPolicy.no_network())
        assert sandbox.closed
    finally:
        await env.close(sandbox)
    assert objects(cluster, namespace, owner) == []


async def test_forged_dialers_do_not_stop_verification(
    namespace: str, tcp_targets: list[EgressTarget]
) -> None:
    """With the CNI enforcing, switches verify as before whatever the workload forged."""
    allowed, denied = tcp_targets
    env = make_env(namespace, owner="forged-enforced")
    async with env.session(plan("public")) as sandbox:
        assert "forged nc" in (await sandbox.exec(_FORGE)).stdout
        await sandbox.set_network_policy(NetworkPolicy.no_network())
        closed = (await connects(sandbox, allowed), await connects(sandbox, denied))
        await sandbox.set_network_policy(NetworkPolicy.allowlist(str(allowed)))
        listed = (await connects(sandbox, allowed), await connects(sandbox, denied))
    assert (closed, listed) == ((False, False), (True, False))


# Root in the sandbox puts its own address for the name first in /etc/hosts.
_HIJACK = (
    '{{ echo "{address} {name}"; cat /etc/hosts; }} > /tmp/hosts && cat /tmp/hosts > /etc/hosts'
    " && getent ahostsv4 {name}"
)


async def test_host_aliases_decide_not_the_sandboxs_hosts_file(
    namespace: str, tcp_targets: list[EgressTarget]
) -> None:
    allowed, denied = tcp_targets
    name = "api.innocent.example"
    env = make_env(namespace, owner="aliases", host_aliases={name: allowed.host})
    # The harness's names need no DNS: the switch works from a policy that closes it.
    async with env.session(plan("no-network")) as sandbox:
        seen = await sandbox.exec(_HIJACK.format(address=denied.host, name=name))
        assert seen.stdout.split()[0] == denied.host, "premise: the sandbox resolves it so"
        await sandbox.set_network_policy(NetworkPolicy.allowlist(f"{name}:{allowed.port}"))
        reach = (await connects(sandbox, allowed), await connects(sandbox, denied))
    assert reach == (True, False), "the agent's /etc/hosts entry decided the allowlist"


async def test_names_resolve_through_corrals_resolver(
    cluster: Any, namespace: str, tcp_targets: list[EgressTarget]
) -> None:
    """corral asks the resolver it gave the Pod, from its own container; the sandbox's
    /etc/hosts and /etc/resolv.conf are not consulted."""
    allowed, denied = tcp_targets
    name = "api.dns.example"
    env = make_env(namespace, owner="resolver", dns_servers=[ALLOWED_IP])
    with serving(ALLOWED_IP, {name: ALLOWED_IP}):
        async with env.session(plan("public")) as sandbox:
            conf = await sandbox.exec(["cat", "/etc/resolv.conf"])
            assert f"nameserver {ALLOWED_IP}" in conf.stdout, conf.stdout
            await sandbox.exec(_HIJACK.format(address=DENIED_IP, name=name))
            await sandbox.exec(f"echo 'nameserver {DENIED_IP}' > /etc/resolv.conf")
            await sandbox.set_network_policy(NetworkPolicy.allowlist(f"{name}:{allowed.port}"))
            reach = (await connects(sandbox, allowed), await connects(sandbox, denied))
            listed: Any = cluster.networking.list_namespaced_network_policy(
                namespace, label_selector=f"corral.session={sandbox.id}"
            )
    dns_rule = listed.items[0].spec.egress[0]
    assert [peer.ip_block.cidr for peer in dns_rule.to] == [f"{ALLOWED_IP}/32"]
    assert {p.port for p in dns_rule.ports} == {53}
    assert reach == (True, False)
