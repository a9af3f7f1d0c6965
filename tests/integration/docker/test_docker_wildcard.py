"""Wildcard hostnames on a real engine: corral's resolver in the holder is the only way a
name resolves, and only what it answered is reachable (`corral.network.wildcard`).

The test's DNS server (conftest's `upstream`) stands for the upstream resolver; its names
point at compose.yaml's TCP targets.
"""

from __future__ import annotations

import pytest

from corral import EnvironmentSession, ExecutionPlan, NetworkPolicy, NetworkSchedule
from corral.errors import NetworkPolicyUnsupported
from corral.providers.docker import DockerEnvironment
from tests.integration.conftest import ALLOWED_IP, DENIED_IP, TCP_PORT
from tests.integration.docker.conftest import TEST_IMAGE, make_env, nameservers

pytestmark = pytest.mark.anyio

WILDCARD = "allowlist:*.allowed.test"


@pytest.fixture
def wild_env(owner: str, upstream: str, runtime: str) -> DockerEnvironment:
    """Under each runtime (`RUNTIMES`): runsc behind a gateway."""
    return make_env(owner, upstream_dns_servers=[upstream], runtime=runtime)


def plan(policy: str, **phases: str) -> ExecutionPlan:
    schedule = NetworkSchedule.model_validate({"baseline": policy, **phases})
    return ExecutionPlan(image=TEST_IMAGE, network=schedule)


async def resolves(sandbox: EnvironmentSession, name: str) -> str | None:
    result = await sandbox.exec(["getent", "ahostsv4", name])
    return result.stdout.split()[0] if result.returncode == 0 and result.stdout else None


async def connects(sandbox: EnvironmentSession, host: str, port: int = TCP_PORT) -> bool:
    result = await sandbox.exec(["nc", "-z", "-w", "3", host, str(port)])
    return result.returncode == 0


#: A raw DNS query for NAME to SERVER over UDP and TCP, from the sandbox's own python;
#: prints what came back (or the error) for each.
RAW_QUERY = r"""
import socket, struct, sys
server, name = sys.argv[1], sys.argv[2]
q = struct.pack(">HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0)
q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0\0\1\0\1"
try:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2)
    u.sendto(q, (server, 53)); data = u.recv(4096)
    print("udp", "rcode=%d" % (data[3] & 15), "answers=%d" % struct.unpack(">H", data[6:8]))
except OSError as e:
    print("udp", "error", type(e).__name__)
try:
    t = socket.create_connection((server, 53), timeout=2)
    t.sendall(struct.pack(">H", len(q)) + q); data = t.recv(4096)[2:]
    print("tcp", "rcode=%d" % (data[3] & 15), "answers=%d" % struct.unpack(">H", data[6:8]))
except (OSError, IndexError, struct.error) as e:
    print("tcp", "error", type(e).__name__)
"""


async def raw_query(sandbox: EnvironmentSession, server: str, name: str) -> str:
    result = await sandbox.exec(["python3", "-c", RAW_QUERY, server, name], timeout=20)
    return result.stdout


async def test_a_name_under_the_wildcard_resolves_and_connects_its_sibling_does_not(
    wild_env: DockerEnvironment, runtime: str
) -> None:
    corrals = nameservers(runtime)[1]
    async with wild_env.session(plan(WILDCARD)) as sandbox:
        conf = await sandbox.read_text("/etc/resolv.conf")
        assert f"nameserver {corrals}" in conf, conf
        assert await resolves(sandbox, "a.allowed.test") == ALLOWED_IP
        assert await connects(sandbox, "a.allowed.test")
        assert await resolves(sandbox, "x.y.allowed.test") is None  # not in the table
        assert await resolves(sandbox, "x.other.test") is None
        assert await resolves(sandbox, "allowed.test") is None  # the apex is not under it
        assert not await connects(sandbox, DENIED_IP)
        # The sibling's answer, asked of corral's resolver directly: refused, not forwarded.
        assert "rcode=5 answers=0" in await raw_query(sandbox, corrals, "x.other.test")


async def test_only_resolved_addresses_are_reachable(wild_env: DockerEnvironment) -> None:
    """Before its name is looked up, an address under the wildcard is refused too."""
    async with wild_env.session(plan(WILDCARD)) as sandbox:
        assert not await connects(sandbox, ALLOWED_IP)
        assert await resolves(sandbox, "b.allowed.test") == ALLOWED_IP
        assert await connects(sandbox, ALLOWED_IP)


async def test_root_cannot_reach_any_resolver_but_corrals(wild_env: DockerEnvironment) -> None:
    async with wild_env.session(plan(WILDCARD)) as sandbox:
        # Learned: ALLOWED_IP is now reachable, on every port but DNS.
        assert await resolves(sandbox, "a.allowed.test") == ALLOWED_IP
        assert await connects(sandbox, ALLOWED_IP)
        # By IP, raw UDP and TCP, to the upstream and to Docker's embedded resolver.
        for server in (ALLOWED_IP, "127.0.0.11"):
            said = await raw_query(sandbox, server, "x.other.test")
            assert "rcode=" not in said, f"{server} answered: {said}"
        # Root rewrites resolv.conf to the upstream: nothing resolves any more.
        wrote = await sandbox.exec(
            ["sh", "-c", f"echo 'nameserver {ALLOWED_IP}' > /etc/resolv.conf"], user="0"
        )
        assert wrote.returncode == 0, wrote.stderr
        assert await resolves(sandbox, "x.other.test") is None
        assert await resolves(sandbox, "c.allowed.test") is None
        # Nor can it mark its packets as corral's resolver does.
        mark = await sandbox.exec(
            ["python3", "-c", "import socket; socket.socket().setsockopt(1, 36, 0x636F7201)"]
        )
        assert mark.returncode != 0 and "PermissionError" in mark.stderr
        # The address of a name it could not resolve stays refused.
        assert not await connects(sandbox, DENIED_IP)


async def test_a_switch_removes_what_the_wildcard_admitted(
    wild_env: DockerEnvironment, runtime: str
) -> None:
    dockers, corrals = nameservers(runtime)
    async with wild_env.session(plan(WILDCARD)) as sandbox:
        assert await resolves(sandbox, "a.allowed.test") == ALLOWED_IP
        assert await connects(sandbox, ALLOWED_IP)
        await sandbox.set_network_policy(NetworkPolicy.no_network())
        assert not await connects(sandbox, ALLOWED_IP)
        assert await resolves(sandbox, "a.allowed.test") is None
        await sandbox.set_network_policy(NetworkPolicy.model_validate(WILDCARD))
        assert not await connects(sandbox, ALLOWED_IP), "a new policy starts with no addresses"
        assert await resolves(sandbox, "a.allowed.test") == ALLOWED_IP
        assert await connects(sandbox, ALLOWED_IP)
        # Straight to another wildcard: the old one's addresses go with it.
        await sandbox.set_network_policy(NetworkPolicy.allowlist("*.other.test"))
        assert not await connects(sandbox, ALLOWED_IP)
        assert await resolves(sandbox, "a.allowed.test") is None
        assert await resolves(sandbox, "x.other.test") == DENIED_IP
        assert await connects(sandbox, DENIED_IP)
        await sandbox.set_network_policy(NetworkPolicy.allowlist(DENIED_IP))
        assert not await connects(sandbox, ALLOWED_IP)
        assert await connects(sandbox, DENIED_IP)
        if runtime == "runc":  # behind a gateway one nameserver answers for both
            assert f"nameserver {corrals}" not in await sandbox.read_text("/etc/resolv.conf")
        await sandbox.set_network_policy(NetworkPolicy.public())
        assert f"nameserver {dockers}" in await sandbox.read_text("/etc/resolv.conf")
        assert await resolves(sandbox, "a.allowed.test") is None  # Docker's: not the test's


async def test_a_later_phase_with_a_wildcard_and_reattach(
    wild_env: DockerEnvironment, owner: str, upstream: str
) -> None:
    """The resolver is bound before the sandbox starts when any phase needs it; a fresh
    environment object finds the policy in force, and the resolver still answers."""
    async with wild_env.session(plan("no-network", run=WILDCARD)) as sandbox:
        assert await resolves(sandbox, "a.allowed.test") is None
        await sandbox.set_network_policy(NetworkPolicy.model_validate(WILDCARD), phase="run")
        other = make_env(owner, upstream_dns_servers=[upstream])
        found = await other.attach(sandbox.id)
        try:
            assert found.policy == NetworkPolicy.model_validate(WILDCARD)
            assert await resolves(found, "a.allowed.test") == ALLOWED_IP
            assert await connects(found, "a.allowed.test")
            assert not await connects(found, DENIED_IP)
        finally:
            await other.close(found)


async def test_a_denylist_with_a_wildcard_is_refused(wild_env: DockerEnvironment) -> None:
    with pytest.raises(NetworkPolicyUnsupported, match=r"'\*\.other\.test'.*'baseline'"):
        await wild_env.open(plan("denylist:*.other.test"))
