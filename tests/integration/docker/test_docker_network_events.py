"""Denied-egress events on a real engine: each refused attempt is listed (destination,
port, protocol, phase), allowed ones are not, root in the sandbox can neither forge nor
erase them, `TaskRun` summarizes them per phase, and a flood stays within the bound."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import anyio
import pytest

from corral import EnvironmentSession, ExecutionPlan, NetworkPolicy, NetworkSchedule, TaskRun
from corral.errors import FeatureUnsupported
from corral.network.events import NetworkEvent, NetworkEvents
from corral.providers.docker.session import DockerSession
from corral.testing.plugin import EgressTarget
from corral.testing.servers import serve_tcp, stop_server
from tests.integration.conftest import ALLOWED_IP, ALLOWED_IP6, DENIED_IP, DENIED_IP6
from tests.integration.docker.conftest import TEST_IMAGE, make_env

pytestmark = pytest.mark.anyio

UDP_SEND = (
    "import socket,sys\n"
    "host,port=sys.argv[1],int(sys.argv[2])\n"
    "s=socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET,socket.SOCK_DGRAM)\n"
    "s.settimeout(2)\n"
    "payload=sys.argv[3].encode() if len(sys.argv)>3 else b'hi'\n"
    "try:\n s.sendto(payload,(host,port));print(s.recv(64).decode())\n"
    "except OSError as e:\n print('err',e);sys.exit(1)\n"
)


def plan(baseline: str, **phases: str) -> ExecutionPlan:
    return ExecutionPlan(
        image=TEST_IMAGE,
        network=NetworkSchedule.model_validate({"baseline": baseline, **phases}),
    )


async def tcp(sandbox: EnvironmentSession, host: str, port: int) -> bool:
    family = ["-6"] if ":" in host else []
    result = await sandbox.exec(["nc", *family, "-z", "-w", "3", host, str(port)])
    return result.returncode == 0


async def udp(sandbox: EnvironmentSession, host: str, port: int, payload: str = "hi") -> bool:
    result = await sandbox.exec(["python3", "-c", UDP_SEND, host, str(port), payload])
    return result.returncode == 0 and "echo:" in result.stdout


def key(event: NetworkEvent) -> tuple[str, str, int | None]:
    return (str(event.destination), event.protocol, event.port)


async def settled_events(
    session: EnvironmentSession, done: Callable[[NetworkEvents], bool], timeout: float = 10
) -> NetworkEvents:
    """The session's events once `done` holds (they arrive within milliseconds)."""
    deadline = time.monotonic() + timeout
    events = session.network_events()
    while not done(events) and time.monotonic() < deadline:
        await anyio.sleep(0.05)
        events = session.network_events()
    return events


@pytest.fixture(scope="module")
def ipv6_targets(target_link: None) -> Iterator[list[EgressTarget]]:
    servers = [serve_tcp(address) for address in (ALLOWED_IP6, DENIED_IP6)]
    yield [EgressTarget(*server.getsockname()[:2]) for server, _ in servers]
    for pair in servers:
        stop_server(*pair)


async def test_each_refused_attempt_is_listed_and_each_admitted_flow_as_allowed(
    owner: str,
    tcp_targets: list[EgressTarget],
    udp_targets: list[EgressTarget],
    ipv6_targets: list[EgressTarget],
    runtime: str,
) -> None:
    env = make_env(owner, ipv6_pool="fd00:c0ff:ee00::/48", runtime=runtime)
    # A gateway (runsc) routes no IPv6: nothing to list there (test_docker_enforcement).
    v6 = runtime == "runc"
    allowed4, denied4 = tcp_targets
    allowed_udp, denied_udp = udp_targets
    allowed6, denied6 = ipv6_targets
    policy = f"allowlist:{ALLOWED_IP},{ALLOWED_IP6}"
    started = time.time()
    async with env.session(plan(policy)) as sandbox:
        reached = (
            await tcp(sandbox, allowed4.host, allowed4.port),
            await udp(sandbox, allowed_udp.host, allowed_udp.port),
            await tcp(sandbox, allowed6.host, allowed6.port) if v6 else True,
        )
        refused = (
            await tcp(sandbox, denied4.host, denied4.port),
            await udp(sandbox, denied_udp.host, denied_udp.port),
            await tcp(sandbox, denied6.host, denied6.port),
            await udp(sandbox, denied6.host, 5353),
        )
        expected = {(DENIED_IP, "tcp", denied4.port), (DENIED_IP, "udp", denied_udp.port)}
        admitted = {(ALLOWED_IP, "tcp", allowed4.port), (ALLOWED_IP, "udp", allowed_udp.port)}
        if v6:
            expected |= {(DENIED_IP6, "tcp", denied6.port), (DENIED_IP6, "udp", 5353)}
            admitted.add((ALLOWED_IP6, "tcp", allowed6.port))
        events = await settled_events(
            sandbox,
            lambda e: (
                expected <= {key(x) for x in e.refused()}
                and admitted <= {key(x) for x in e.allowed()}
            ),
        )
    assert reached == (True, True, True)
    assert refused == (False, False, False, False)
    assert {key(x) for x in events.refused()} == expected, events  # not corral's own probes
    # One event per flow: the connection's first packet, not each of its packets.
    assert sorted(key(x) for x in events.allowed()) == sorted(admitted), events
    for item in events.events:
        assert item.phase == "baseline"
        assert started - 1 <= item.time.timestamp() <= time.time() + 1
    assert events.dropped == 0 and events.lost == 0 and events.error is None


async def test_the_reader_outlives_a_quiet_spell_longer_than_an_api_call(
    owner: str, tcp_targets: list[EgressTarget]
) -> None:
    """A sandbox that is refused nothing for longer than `api_timeout_s` still has its
    reader: the stream's socket must not carry the engine client's per-call timeout."""
    env = make_env(owner, api_timeout_s=4)
    denied = tcp_targets[1]
    async with env.session(plan("no-network")) as sandbox:
        await anyio.sleep(6)
        assert not await tcp(sandbox, denied.host, denied.port)
        events = await settled_events(sandbox, lambda e: bool(e.refused()))
    assert events.error is None, events.error
    assert [key(x) for x in events.refused()] == [(DENIED_IP, "tcp", denied.port)]


async def test_root_in_the_sandbox_cannot_forge_or_erase_events(
    owner: str, tcp_targets: list[EgressTarget], udp_targets: list[EgressTarget], runtime: str
) -> None:
    env = make_env(owner, runtime=runtime)
    denied = tcp_targets[1]
    # A payload that looks like the reader's output, sent where it is refused.
    forged = f"\nE {time.time_ns()} corral:run 4 6 203.0.113.9 443\nL 99\n"
    bind_log_group = (
        "import socket,struct\n"
        "s=socket.socket(socket.AF_NETLINK,socket.SOCK_RAW,12);s.bind((0,0))\n"
        "attr=struct.pack('<HH',8,1)+bytes([1,0,0,0])\n"
        "body=struct.pack('>BBH',0,0,13)+attr\n"
        "s.send(struct.pack('<IHHII',16+len(body),(4<<8)|1,5,1,0)+body)\n"
        "ans=s.recv(4096);print('errno',-struct.unpack('<i',ans[16:20])[0])\n"
    )
    async with env.session(plan("no-network")) as sandbox:
        assert not await tcp(sandbox, denied.host, denied.port)
        before = await settled_events(sandbox, lambda e: len(e.events) >= 1)
        assert [key(x) for x in before.events] == [(DENIED_IP, "tcp", denied.port)]
        assert before.allowed() == (), "no-network admits nothing"
        attacks = [
            # the log group: binding it (to read or steal events) needs NET_ADMIN
            ["python3", "-c", bind_log_group],
            # the rules that log: flushing them needs NET_ADMIN too
            ["iptables", "-F"],
            ["iptables-nft", "-F"],
            ["iptables-legacy", "-F"],
            # anything it likes, anywhere it can write
            [
                "sh",
                "-c",
                "for d in / /tmp /run /var/tmp /dev/shm; do "
                "printf 'E 1 corral:run 4 6 203.0.113.9 443\\n' > $d/.corral-events-x 2>/dev/null;"
                " done",
            ],
        ]
        outputs = [await sandbox.exec(argv, user="0") for argv in attacks]
        # EPERM; gVisor's kernel has no netfilter netlink at all (and the log is not in it)
        assert "errno 1" in outputs[0].stdout or (
            runtime == "runsc" and outputs[0].returncode != 0
        ), outputs[0]
        assert all(out.returncode != 0 for out in outputs[1:4]), outputs
        # The reader is not among the processes it can see, or kill.
        hunt = await sandbox.exec(
            ["sh", "-c", "ps -eo args; pkill -9 -f nflog; pkill -9 -f corral-events"], user="0"
        )
        assert "nflog" not in hunt.stdout.replace("pkill -9 -f nflog", ""), hunt
        assert not await udp(sandbox, udp_targets[1].host, udp_targets[1].port, forged)
        after = await settled_events(sandbox, lambda e: len(e.events) >= 2)
    assert [key(x) for x in after.events] == [
        (DENIED_IP, "tcp", denied.port),
        (DENIED_IP, "udp", udp_targets[1].port),
    ]
    assert after.events[0] == before.events[0]
    assert after.lost == 0 and after.error is None


async def test_taskrun_summarizes_refusals_per_phase(
    owner: str, tcp_targets: list[EgressTarget], udp_targets: list[EgressTarget], runtime: str
) -> None:
    env = make_env(owner, runtime=runtime)
    denied, denied_udp = tcp_targets[1], udp_targets[1]
    allowed = f"allowlist:{ALLOWED_IP}"
    task = plan(allowed, run="no-network", evaluation=allowed)

    async def grade(session: EnvironmentSession) -> None:
        assert not await udp(session, denied_udp.host, denied_udp.port)

    async with TaskRun(env, task) as run:
        assert not await tcp(run.session, denied.host, denied.port)
        async with run.running():
            assert not await tcp(run.session, denied.host, denied.port)
            assert not await tcp(run.session, tcp_targets[0].host, tcp_targets[0].port)
        await run.evaluate(grade)
        await settled_events(run.session, lambda e: len(e.events) >= 4)
    summary = run.network_summary()
    assert {phase: s.refused for phase, s in summary.items()} == {
        "baseline": 1,
        "run": 2,
        "evaluation": 1,
    }
    assert summary["run"].top_destinations == {
        f"{DENIED_IP}:{denied.port}/tcp": 1,
        f"{ALLOWED_IP}:{tcp_targets[0].port}/tcp": 1,
    }
    assert summary["evaluation"].top_destinations == {f"{DENIED_IP}:{denied_udp.port}/udp": 1}


async def test_a_flood_keeps_the_bound_and_counts_what_it_dropped(
    owner: str, udp_targets: list[EgressTarget]
) -> None:
    env = make_env(owner, network_events_limit=200)
    denied = udp_targets[1]
    flood = (
        f"for i in $(seq 5000); do echo x > /dev/udp/{denied.host}/$((1000 + i % 1000)); "
        "done 2>/dev/null; true"
    )
    async with env.session(plan("no-network")) as sandbox:
        result = await sandbox.exec(["bash", "-c", flood], timeout=120)
        assert result.returncode == 0, result
        events = await settled_events(sandbox, lambda e: e.dropped >= 800)
        assert len(events.events) == 200
        # At most the kernel's burst and rate were logged; the rest were refused unlisted.
        assert 800 <= events.dropped <= 5000 - 200
        # what was dropped is still counted: a flood cannot hide that attempts happened
        assert events.totals == {"baseline": {"udp": 200 + events.dropped}}
        assert events.error is None
        # The reader is still there: the next attempt is listed, as the newest.
        assert not await udp(sandbox, denied.host, 7)
        await anyio.sleep(1.5)  # the limit's burst refills (500/s)
        assert not await udp(sandbox, denied.host, 7)
        last = await settled_events(sandbox, lambda e: e.events[-1].port == 7)
    assert key(last.events[-1]) == (DENIED_IP, "udp", 7)
    assert len(last.events) == 200


async def test_without_the_reader_network_events_says_why(owner: str) -> None:
    env = make_env(owner, network_events=False)
    async with env.session(plan("no-network")) as sandbox:
        with pytest.raises(FeatureUnsupported, match="network_events=False"):
            sandbox.network_events()
    assert env.features().supports_network_events


async def test_a_reattached_sandbox_keeps_its_phase_and_its_reader_is_one(
    owner: str, tcp_targets: list[EgressTarget]
) -> None:
    denied = tcp_targets[1]
    first = make_env(owner)
    session = await first.open(plan("no-network"))
    assert isinstance(session, DockerSession)
    try:
        await session.set_network_policy(NetworkPolicy.no_network(), phase="run")
        # While the first process reads, the log group is its reader's: another is refused.
        busy = await make_env(owner).attach(session.id)
        assert busy.phase == "run"  # read back from the kernel's rules
        with pytest.raises(FeatureUnsupported, match="not permitted"):
            busy.network_events()
        # The first process goes (its reader with it): the next one to attach reads on.
        assert session.feed.reader is not None
        await session.feed.reader.aclose()
        await anyio.sleep(0.5)
        again = await make_env(owner).attach(session.id)
        assert again.phase == "run"
        assert not await tcp(again, denied.host, denied.port)
        seen = await settled_events(again, lambda e: len(e.events) >= 1)
        assert [(key(x), x.phase) for x in seen.events] == [
            ((DENIED_IP, "tcp", denied.port), "run")
        ]
    finally:
        await first.close(session)


async def test_taskrun_shows_per_phase_what_the_agent_reached_and_was_denied(
    owner: str, tcp_targets: list[EgressTarget], runtime: str
) -> None:
    """Under an allowlist that names a host, the agent reaches it (listed as admitted,
    under its name) and is refused another; the summary keeps them apart by phase."""
    env = make_env(owner, runtime=runtime)
    allowed, denied = tcp_targets
    task = plan("no-network", run=f"allowlist:allowed.corral.test:{allowed.port}")
    async with TaskRun(env, task) as run:
        async with run.running():
            assert await tcp(run.session, "allowed.corral.test", allowed.port)
            assert not await tcp(run.session, denied.host, denied.port)
            events = await settled_events(
                run.session, lambda e: len(e.allowed()) >= 1 and len(e.refused()) >= 1
            )
        await run.evaluate(lambda s: tcp(s, allowed.host, allowed.port))
        await settled_events(run.session, lambda e: len(e.refused()) >= 2)
    (reached,) = events.allowed()
    assert (reached.phase, reached.name, reached.port) == (
        "run",
        "allowed.corral.test",
        allowed.port,
    )
    summary = run.network_summary()
    assert summary["run"].allowed == 1 and summary["run"].refused == 1
    assert summary["run"].top_allowed == {f"allowed.corral.test:{allowed.port}/tcp": 1}
    assert summary["run"].top_destinations == {f"{DENIED_IP}:{denied.port}/tcp": 1}
    # The grader, under the evaluation phase's no-network, was refused the same host.
    assert summary["evaluation"].allowed == 0 and summary["evaluation"].refused == 1
