"""Transport-layer enforcement on a real engine: every mode, every protocol, root inside."""

from __future__ import annotations

import time
from collections.abc import Iterator

import anyio
import pytest

from corral import EnvironmentSession, ExecutionPlan, NetworkPolicy, NetworkSchedule
from corral.providers.docker import DockerEnvironment
from corral.providers.docker.session import DockerSession
from corral.testing.conformance import served_through
from corral.testing.plugin import EgressTarget
from corral.testing.servers import serve_tcp, stop_server
from tests.integration.conftest import ALLOWED_IP, ALLOWED_IP6, DENIED_IP, DENIED_IP6
from tests.integration.docker.conftest import TEST_IMAGE, make_env
from tests.integration.enforcement_cases import flows_across_a_switch

pytestmark = pytest.mark.anyio


@pytest.fixture
def docker_env(routed_env: DockerEnvironment) -> DockerEnvironment:
    """Every test here under each runtime (`RUNTIMES`): runsc behind a gateway."""
    return routed_env


def plan(policy: str | NetworkPolicy) -> ExecutionPlan:
    return ExecutionPlan(
        image=TEST_IMAGE, network=NetworkSchedule.model_validate({"baseline": policy})
    )


async def tcp(sandbox: EnvironmentSession, target: EgressTarget) -> bool:
    result = await sandbox.exec(["nc", "-z", "-w", "3", target.host, str(target.port)])
    return result.returncode == 0


async def udp(sandbox: EnvironmentSession, server: EgressTarget) -> bool:
    script = (
        "import socket,sys\n"
        "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(2)\n"
        f"s.sendto(b'hi',('{server.host}',{server.port}))\n"
        "try:\n print(s.recv(64).decode())\nexcept OSError as e:\n print('err',e);sys.exit(1)\n"
    )
    result = await sandbox.exec(["python3", "-c", script])
    return result.returncode == 0 and "echo:hi" in result.stdout


async def icmp(sandbox: EnvironmentSession, address: str) -> bool:
    result = await sandbox.exec(["ping", "-c", "1", "-W", "2", address])
    return result.returncode == 0


async def dns(sandbox: EnvironmentSession, name: str) -> bool:
    # The holder's container name resolves only through Docker's embedded DNS server.
    result = await sandbox.exec(["getent", "hosts", name])
    return result.returncode == 0


CASES = {
    "public": ("public", (True, True)),
    "no-network": ("no-network", (False, False)),
    "allowlist-address": (f"allowlist:{ALLOWED_IP}", (True, False)),
    "allowlist-hostname": ("allowlist:allowed.corral.test", (True, False)),
    "denylist-address": (f"denylist:{DENIED_IP}", (True, False)),
    "denylist-hostname": ("denylist:denied.corral.test", (True, False)),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_each_mode_for_tcp_udp_icmp(
    docker_env: DockerEnvironment,
    case: str,
    tcp_targets: list[EgressTarget],
    udp_targets: list[EgressTarget],
) -> None:
    policy, (allowed, denied) = CASES[case]
    async with docker_env.session(plan(policy)) as sandbox:
        seen = {
            "tcp": (await tcp(sandbox, tcp_targets[0]), await tcp(sandbox, tcp_targets[1])),
            "udp": (await udp(sandbox, udp_targets[0]), await udp(sandbox, udp_targets[1])),
            "icmp": (await icmp(sandbox, ALLOWED_IP), await icmp(sandbox, DENIED_IP)),
        }
    assert seen == {proto: (allowed, denied) for proto in seen}, case


async def test_no_network_fails_fast(
    docker_env: DockerEnvironment, tcp_targets: list[EgressTarget]
) -> None:
    async with docker_env.session(plan("no-network")) as sandbox:
        started = time.monotonic()
        result = await sandbox.exec(["nc", "-z", "-w", "10", ALLOWED_IP, str(tcp_targets[0].port)])
        elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert elapsed < 2, f"a refused connection took {elapsed:.2f} s; REJECT should be immediate"


async def test_dns_closed_under_no_network_and_allowlists(
    docker_env: DockerEnvironment,
) -> None:
    async with docker_env.session(plan("public")) as sandbox:
        holder_name = f"corral-{sandbox.id}-holder"
        assert await dns(sandbox, holder_name), "embedded DNS must answer under public"
        await sandbox.set_network_policy(NetworkPolicy.no_network())
        assert not await dns(sandbox, holder_name)
        await sandbox.set_network_policy(NetworkPolicy.allowlist(ALLOWED_IP))
        assert not await dns(sandbox, holder_name)
        # An allowlist that names a host: the only resolver is corral's, which answers the
        # policy's names only (this one is the harness's, from /etc/hosts).
        await sandbox.set_network_policy(NetworkPolicy.allowlist("allowed.corral.test"))
        assert not await dns(sandbox, holder_name), "an unlisted name resolved"
        assert await dns(sandbox, "allowed.corral.test")
        await sandbox.set_network_policy(NetworkPolicy.public())
        assert await dns(sandbox, holder_name), "embedded DNS must answer under public again"


async def test_root_in_the_sandbox_cannot_change_the_rules(
    docker_env: DockerEnvironment, tcp_targets: list[EgressTarget]
) -> None:
    async with docker_env.session(plan("no-network")) as sandbox:
        attempts = {
            "flush": "iptables -F",
            "flush6": "ip6tables -F",
            "legacy": "iptables-legacy -F",
            "policy": "iptables -P OUTPUT ACCEPT",
            "link": "ip link set eth0 down",
            "route": "ip route add 10.214.0.0/24 dev lo",
            "netns": "unshare --net true",
            "nft": "iptables-nft -F",  # the nf_tables netlink API, as nft(8) would use it
            "raw": 'python3 -c "import socket; socket.socket(2, 3, 1)"',
        }
        results = {name: await sandbox.exec(cmd) for name, cmd in attempts.items()}
        whoami = await sandbox.exec(["id", "-u"])
        still_closed = not await tcp(sandbox, tcp_targets[0])
    assert whoami.stdout.strip() == "0"
    succeeded = [name for name, r in results.items() if r.returncode == 0]
    assert succeeded == [], f"root changed the network from inside: {succeeded}"
    assert still_closed


async def test_switch_cuts_an_open_connection(
    docker_env: DockerEnvironment, udp_targets: list[EgressTarget]
) -> None:
    """A flow opened under public does not survive a switch to no-network, and no new one
    starts after it."""
    async with docker_env.session(plan("public")) as sandbox:
        flows = await flows_across_a_switch(sandbox, ALLOWED_IP, udp_targets[0].port)
    assert flows[0] == ("ok", "ok"), flows
    assert flows[-1] == ("blocked", "blocked"), flows
    cut = next(i for i, (old, _) in enumerate(flows) if old == "blocked")
    assert all(pair == ("blocked", "blocked") for pair in flows[cut:]), flows


async def test_two_sandboxes_cannot_reach_each_other(docker_env: DockerEnvironment) -> None:
    async with docker_env.session(plan("public")) as a, docker_env.session(plan("public")) as b:
        assert isinstance(a, DockerSession)
        address = a.net.address
        reach = own = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: a.exec(["nc", "-l", "-p", "9000"], timeout=8))
            await anyio.sleep(0.5)
            reach = await b.exec(["nc", "-z", "-w", "2", address, "9000"])
            own = await a.exec(["nc", "-z", "-w", "2", "127.0.0.1", "9000"])
            tg.cancel_scope.cancel()
    assert own is not None and own.returncode == 0, "the listener works locally"
    assert reach is not None and reach.returncode != 0, "a sandbox reached another sandbox"


async def test_failed_switch_keeps_the_old_policy(
    docker_env: DockerEnvironment, tcp_targets: list[EgressTarget]
) -> None:
    async with docker_env.session(plan("no-network")) as sandbox:
        with pytest.raises(ValueError, match="wildcard"):
            await sandbox.set_network_policy(NetworkPolicy.denylist("*.corral.test"))
        assert sandbox.policy == NetworkPolicy.no_network()
        assert not await tcp(sandbox, tcp_targets[0])


@pytest.fixture(scope="module")
def ipv6_targets(target_link: None) -> Iterator[list[EgressTarget]]:
    """TCP listeners on the host's IPv6 test addresses."""
    servers = [serve_tcp(address) for address in (ALLOWED_IP6, DENIED_IP6)]
    yield [EgressTarget(*server.getsockname()[:2]) for server, _ in servers]
    for pair in servers:
        stop_server(*pair)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("public", (True, True)),
        ("no-network", (False, False)),
        ("allowlist:{allowed}", (True, False)),
        ("denylist:{denied}", (True, False)),
    ],
)
async def test_ipv6_is_covered_by_the_same_rule(
    owner: str, ipv6_targets: list[EgressTarget], policy: str, expected: tuple[bool, bool]
) -> None:
    env = make_env(owner, ipv6_pool="fd00:c0ff:ee00::/48")
    allowed, denied = ipv6_targets
    text = policy.format(allowed=allowed.host, denied=denied.host)
    async with env.session(plan(text)) as sandbox:
        seen: list[bool] = []
        for target in ipv6_targets:
            result = await sandbox.exec(
                ["nc", "-6", "-z", "-w", "3", target.host, str(target.port)]
            )
            seen.append(result.returncode == 0)
    assert tuple(seen) == expected, text


async def test_denied_v4_mapped_address_blocks_its_ipv4_target(
    docker_env: DockerEnvironment, tcp_targets: list[EgressTarget]
) -> None:
    """`::ffff:a.b.c.d` is where an IPv6 socket sends IPv4 traffic: IPv4 rules must deny it."""
    allowed, denied = tcp_targets
    mapped = (
        "import socket,sys\n"
        "s=socket.socket(socket.AF_INET6);s.settimeout(3)\n"
        f"sys.exit(s.connect_ex(('::ffff:{denied.host}',{denied.port})))\n"
    )
    async with docker_env.session(plan(f"denylist:::ffff:{denied.host}")) as sandbox:
        seen = (
            await tcp(sandbox, allowed),
            await tcp(sandbox, denied),
            (await sandbox.exec(["python3", "-c", mapped])).returncode == 0,
        )
    assert seen == (True, False, False)


@pytest.mark.parametrize("policy", ["public", "no-network"])
async def test_behind_a_gateway_nothing_goes_over_ipv6(
    owner: str, ipv6_targets: list[EgressTarget], policy: str
) -> None:
    """The gateway routes IPv4 only: a sandbox behind it has no IPv6 route in any mode,
    though its network has IPv6 (SECURITY.md)."""
    env = make_env(owner, ipv6_pool="fd00:c0ff:ee00::/48", gateway=True)
    async with env.session(plan(policy)) as sandbox:
        seen = [
            (await sandbox.exec(["nc", "-6", "-z", "-w", "3", t.host, str(t.port)])).returncode == 0
            for t in ipv6_targets
        ]
    assert seen == [False, False]


@pytest.mark.parametrize("published", [False, True], ids=["address", "published"])
async def test_an_endpoint_reaches_the_sandbox_under_no_network(
    owner: str, runtime: str, published: bool
) -> None:
    """Inbound is not egress: under no-network the caller still reaches a port the sandbox
    serves, at `endpoint()` (the holder's address, or a port published on loopback). Behind
    a gateway (runsc) the holder forwards it over the link (`gateway._LINK`)."""
    port = 18_080
    env = make_env(owner, runtime=runtime, published_ports=(port,) if published else ())
    async with env.session(plan("no-network")) as sandbox:
        url = await sandbox.endpoint(port)
        assert url is not None
        assert url.startswith("http://127.0.0.1:") == published, url
        serve = ["sh", "-c", f"printf ok | nc -l -N -p {port}"]
        received = await served_through(sandbox, url, serve)
    assert received == b"ok"
