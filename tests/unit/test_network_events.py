"""Denied-egress events: the reader's line format read as hostile input, the bounded log,
corral's own probes taken out, summaries per phase, and the phases `TaskRun` hands down."""

from __future__ import annotations

import ipaddress
import time
from datetime import UTC, datetime
from typing import ClassVar

import pytest

from corral.core.lifecycle import TaskRun
from corral.core.plan import ExecutionPlan
from corral.errors import FeatureUnsupported
from corral.network.events import (
    EventLog,
    NetworkEvent,
    NetworkEvents,
    ReaderHello,
    ReaderLost,
    log_prefix,
    parse_line,
    phase_in_rules,
    phase_of_prefix,
    summarize,
)
from corral.network.policy import NetworkPolicy, NetworkSchedule, Phase
from corral.providers.docker.events import demux
from tests.unit.fakes import FakeEnvironment, FakeSession

pytestmark = pytest.mark.anyio

NOW_NS = 1_764_748_800_123_456_789


def line(*fields: object) -> bytes:
    return " ".join(str(f) for f in fields).encode()


def test_an_event_line_is_read_whole() -> None:
    item = parse_line(line("E", NOW_NS, "corral:run", 4, 6, "10.9.8.7", 8080))
    assert item == NetworkEvent(
        time=datetime.fromtimestamp(NOW_NS / 1e9, tz=UTC),
        phase="run",
        protocol="tcp",
        destination=ipaddress.ip_address("10.9.8.7"),
        port=8080,
    )
    v6 = parse_line(line("E", NOW_NS, "corral:evaluation_baseline", 6, 17, "fd00::1", 53))
    assert isinstance(v6, NetworkEvent)
    assert (v6.phase, v6.protocol, str(v6.destination), v6.port) == (
        "evaluation_baseline",
        "udp",
        "fd00::1",
        53,
    )
    icmp = parse_line(line("E", NOW_NS, "corral:none", 4, 1, "192.0.2.1", "-"))
    assert isinstance(icmp, NetworkEvent)
    assert (icmp.phase, icmp.protocol, icmp.port) == (None, "icmp", None)
    odd = parse_line(line("E", NOW_NS, "corral:baseline", 4, 47, "192.0.2.1", "-"))
    assert isinstance(odd, NetworkEvent) and odd.protocol == "47"
    assert parse_line(b"H 1") == ReaderHello()
    assert parse_line(b"L 3") == ReaderLost(total=3)


GARBLED = [
    b"",
    b"E",
    b"H 2",
    b"L -1",
    b"L 0",
    b"L 99999999999999999999999",
    line("E", NOW_NS, "corral:run", 4, 6, "10.9.8.7"),  # a field short
    line("E", NOW_NS, "corral:run", 4, 6, "10.9.8.7", 80, "x"),  # one too many
    line("E", NOW_NS, "corral:runs", 4, 6, "10.9.8.7", 80),  # not a phase
    line("E", NOW_NS, "other:run", 4, 6, "10.9.8.7", 80),  # not corral's prefix
    line("E", NOW_NS, "corral:run", 6, 6, "10.9.8.7", 80),  # family does not match
    line("E", NOW_NS, "corral:run", 4, 6, "::ffff:10.9.8.7", 80),
    line("E", NOW_NS, "corral:run", 5, 6, "10.9.8.7", 80),
    line("E", NOW_NS, "corral:run", 4, 256, "10.9.8.7", 80),  # no such protocol
    line("E", NOW_NS, "corral:run", 4, 6, "10.9.8.7", 65536),  # no such port
    line("E", NOW_NS, "corral:run", 4, 6, "10.9.8.7", "+80"),
    line("E", NOW_NS, "corral:run", 4, 6, "10.9.8.7", "080"),
    line("E", NOW_NS, "corral:run", 4, 6, "010.9.8.7", 80),  # not canonical
    line("E", NOW_NS, "corral:run", 6, 6, "FD00::1", 80),
    line("E", NOW_NS, "corral:run", 6, 6, "fd00::1%eth0", 80),  # a zone: not a destination
    line("E", NOW_NS, "corral:run", 4, 6, "example.com", 80),
    line("E", -1, "corral:run", 4, 6, "10.9.8.7", 80),
    line("E", "1e9", "corral:run", 4, 6, "10.9.8.7", 80),
    line("E", NOW_NS, "corral:run", "٤", 6, "10.9.8.7", 80),  # a non-ASCII digit
    line("E", NOW_NS, "corral:run", 4, 6, "10.9.8.7", 80).replace(b" ", b"\t"),
    line("E", NOW_NS, "corral:run", 4, 6, "10.9.8.7", 80) + b" ",
    line("E ", NOW_NS, "corral:run", 4, 6, "10.9.8.7", 80),
    b"E " + b"9" * 300,
    "E 1 corral:run 4 6 10.9.8.7 80\u00e9".encode(),
    b"\xff\xfe",
]


@pytest.mark.parametrize("raw", GARBLED)
def test_a_garbled_line_is_refused_whole(raw: bytes) -> None:
    with pytest.raises(ValueError):
        parse_line(raw)


def test_the_log_counts_garbage_and_never_half_reads_it() -> None:
    events = EventLog(limit=10)
    good = line("E", NOW_NS, "corral:run", 4, 17, "10.0.0.1", 53) + b"\n"
    # Split anywhere, interleaved with garbage, a line with no end, and a lost count.
    stream = b"H 1\n" + b"E 1 junk\n" + good + b"x" * 500 + b"\n" + good + b"L 2\nL 1\n"
    for i in range(0, len(stream), 7):
        events.feed(stream[i : i + 7])
    snap = events.snapshot()
    assert [str(e.destination) for e in snap.events] == ["10.0.0.1", "10.0.0.1"]
    # the junk line and the 500-byte one count once each; the reader's own count is its
    # running total (2, then a stale 1)
    assert snap.lost == 1 + 1 + 2
    assert snap.dropped == 0


def test_a_line_with_no_newline_is_bounded() -> None:
    events = EventLog(limit=10)
    for _ in range(1000):
        events.feed(b"A" * 1000)
    assert len(events._partial) <= 200  # pyright: ignore[reportPrivateUsage]
    assert events.snapshot().lost == 1
    events.feed(b"\n" + line("E", NOW_NS, "corral:run", 4, 6, "10.0.0.1", 1) + b"\n")
    assert len(events.snapshot().events) == 1


def test_memory_is_bounded_under_a_flood() -> None:
    events = EventLog(limit=100)
    chunk = b"".join(
        line("E", NOW_NS + i, "corral:run", 4, 6, "10.0.0.1", 1 + i % 60000) + b"\n"
        for i in range(5000)
    )
    events.feed(chunk)
    snap = events.snapshot()
    assert len(snap.events) == 100
    assert snap.dropped == 4900
    # the newest are kept, in order; the totals count every one read
    assert [e.port for e in snap.events] == [1 + i % 60000 for i in range(4900, 5000)]
    assert snap.totals == {"run": {"tcp": 5000}}
    assert snap.summary()["run"].refused == 5000
    assert sum(snap.summary()["run"].top_destinations.values()) == 20  # of the kept ones


def test_admitted_flows_are_kept_apart_from_refusals_and_named() -> None:
    """A flood of admitted flows never pushes a refusal out (each verdict keeps its own
    `limit`); an admitted flow to an address the policy resolved a name to carries it."""
    events = EventLog(limit=10)
    events.name_addresses({"api.example.com": (ipaddress.ip_address("10.0.0.7"),)})
    events.feed(line("E", NOW_NS, "corral:run", 4, 6, "10.0.0.9", 443) + b"\n")
    events.feed(
        b"".join(
            line("E", NOW_NS + 1 + i, "corral:run:allowed", 4, 6, "10.0.0.7", 443) + b"\n"
            for i in range(500)
        )
    )
    snap = events.snapshot()
    assert [(str(e.destination), e.verdict) for e in snap.refused()] == [("10.0.0.9", "refused")]
    assert len(snap.allowed()) == 10 and snap.dropped == 490
    assert {e.name for e in snap.allowed()} == {"api.example.com"}
    assert snap.totals == {"run": {"tcp": 1}} and snap.allowed_totals == {"run": {"tcp": 500}}
    summary = snap.summary()["run"]
    assert (summary.refused, summary.allowed) == (1, 500)
    assert summary.top_allowed == {"api.example.com:443/tcp": 10}
    assert summary.top_destinations == {"10.0.0.9:443/tcp": 1}
    assert "allowed tcp 10.0.0.7:443 (api.example.com)" in str(snap.allowed()[0])


def test_corrals_own_probe_is_taken_out_once() -> None:
    events = EventLog(limit=10)
    gateway = ipaddress.ip_address("172.30.0.1")
    events.expect_own(gateway, 9)
    probe = line("E", NOW_NS, "corral:run", 4, 6, "172.30.0.1", 9) + b"\n"
    events.feed(probe + probe)
    assert len(events.snapshot().events) == 1  # the second is the workload's
    other = line("E", NOW_NS, "corral:run", 4, 17, "172.30.0.1", 9) + b"\n"
    events.expect_own(gateway, 9)
    events.feed(other)  # UDP: not the probe
    assert len(events.snapshot().events) == 2


def test_an_expected_probe_that_never_came_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    events = EventLog(limit=10)
    events.expect_own(ipaddress.ip_address("172.30.0.1"), 9)
    later = time.monotonic() + 60
    monkeypatch.setattr("corral.network.events._time.monotonic", lambda: later)
    events.feed(line("E", NOW_NS, "corral:run", 4, 6, "172.30.0.1", 9) + b"\n")
    assert len(events.snapshot().events) == 1


def test_expected_probes_are_bounded() -> None:
    events = EventLog(limit=10)
    for port in range(1000):
        events.expect_own(ipaddress.ip_address("10.0.0.1"), port)
    assert len(events._own) <= 16  # pyright: ignore[reportPrivateUsage]


def test_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        EventLog(limit=0)


def test_prefixes_and_phases() -> None:
    assert log_prefix(None) == "corral:none"
    assert log_prefix("evaluation") == "corral:evaluation"
    assert phase_of_prefix("corral:baseline") == "baseline"
    assert log_prefix("run", "allowed") == "corral:run:allowed"
    assert phase_of_prefix("corral:run:allowed") == "run"
    for prefix in ("corral:run:allowedx", "corral:allowed", "corral:run:allowed:allowed"):
        with pytest.raises(ValueError):
            phase_of_prefix(prefix)
    with pytest.raises(ValueError):
        log_prefix("later")  # type: ignore[arg-type]
    saved = (
        "-A CORRAL-EGRESS -p tcp -m limit --limit 500/sec --limit-burst 1000 -j NFLOG "
        '--nflog-prefix "corral:evaluation" --nflog-group 13 --nflog-size 128\n'
    )
    assert phase_in_rules(saved) == "evaluation"
    assert phase_in_rules(saved.replace('"', "")) == "evaluation"
    assert phase_in_rules("-A CORRAL-EGRESS -j ACCEPT\n") is None


def _event(phase: Phase | None, protocol: str, dest: str, port: int | None) -> NetworkEvent:
    return NetworkEvent(
        time=datetime.now(UTC),
        phase=phase,
        protocol=protocol,
        destination=ipaddress.ip_address(dest),
        port=port,
    )


def test_summary_per_phase() -> None:
    items = [
        _event("run", "tcp", "10.0.0.1", 80),
        _event("run", "tcp", "10.0.0.1", 80),
        _event("run", "udp", "fd00::1", 53),
        _event("evaluation", "icmp", "10.0.0.2", None),
        _event(None, "tcp", "10.0.0.3", 22),
    ]
    summary = summarize([NetworkEvents(events=tuple(items))])
    assert set(summary) == {"run", "evaluation", "none"}
    assert summary["run"].refused == 3
    assert summary["run"].by_protocol == {"tcp": 2, "udp": 1}
    assert summary["run"].top_destinations == {"10.0.0.1:80/tcp": 2, "[fd00::1]:53/udp": 1}
    assert summary["evaluation"].top_destinations == {"10.0.0.2/icmp": 1}
    assert NetworkEvents(events=tuple(items)).summary() == summary


def test_summary_destinations_are_bounded() -> None:
    items = [_event("run", "tcp", "10.0.0.1", port) for port in range(1, 500)]
    assert len(summarize([NetworkEvents(events=tuple(items))])["run"].top_destinations) == 20


def test_engine_stream_demux() -> None:
    buffer = bytearray(b"\x01\x00\x00\x00\x00\x00\x00\x03abc\x02\x00\x00\x00\x00\x00\x00\x02e")
    assert demux(buffer) == (b"abc", b"")
    assert buffer == b"\x02\x00\x00\x00\x00\x00\x00\x02e"
    buffer += b"r"
    assert demux(buffer) == (b"", b"er")
    assert buffer == b""


# -- the base session and TaskRun ------------------------------------------------------------


class RecordingSession(FakeSession):
    """Stamps each refusal with the phase in force, as a provider's rules would."""

    def __init__(self, env: FakeEnvironment, policy: NetworkPolicy) -> None:
        super().__init__(env, policy)
        self.phase = "baseline"
        self.fake_events = EventLog(limit=10)
        RecordingEnvironment.sessions.append(self)

    def network_events(self) -> NetworkEvents:
        return self.fake_events.snapshot()


class RecordingEnvironment(FakeEnvironment):
    session_type = RecordingSession
    supports_network_events = True
    sessions: ClassVar[list[RecordingSession]] = []


def _refused(session: RecordingSession, port: int) -> None:
    session.fake_events.add(_event(session.phase, "tcp", "10.0.0.1", port))


async def test_a_session_without_events_says_so() -> None:
    env = FakeEnvironment()
    async with env.session(ExecutionPlan(image="x")) as session:
        with pytest.raises(FeatureUnsupported, match="network_events"):
            session.network_events()


async def test_taskrun_hands_each_phase_down_and_summarizes_per_phase() -> None:
    env = RecordingEnvironment()
    plan = ExecutionPlan(
        image="x",
        network=NetworkSchedule(
            baseline=NetworkPolicy.no_network(),
            run=NetworkPolicy.no_network(),  # the same policy: only the phase changes
            evaluation=NetworkPolicy.allowlist("10.0.0.9"),
        ),
    )
    async with TaskRun(env, plan) as run:
        session = env.sessions[-1]
        _refused(session, 1)
        async with run.running():
            assert session.phase == "run"
            _refused(session, 2)
            _refused(session, 3)

        async def grade(s: object) -> None:
            assert session.phase == "evaluation"
            _refused(session, 4)

        await run.evaluate(grade)
        assert session.phase == "baseline"
    summary = run.network_summary()
    assert {k: v.refused for k, v in summary.items()} == {"baseline": 1, "run": 2, "evaluation": 1}
    # the run phase's policy was the baseline's: no switch was applied for it
    applied = [mode for sid, mode in env.calls if sid == session.id and mode != "end_workload"]
    assert applied == ["allowlist", "no-network"]


@pytest.mark.usefixtures("helper_shipped")
def test_which_providers_report_events() -> None:
    from typer.testing import CliRunner

    from corral.cli import app
    from corral.providers.docker.environment import DockerEnvironment
    from corral.providers.k8s.environment import KubernetesEnvironment
    from corral.providers.local.environment import LocalEnvironment

    assert DockerEnvironment.features().supports_network_events
    assert not KubernetesEnvironment.features().supports_network_events
    assert not LocalEnvironment.features().supports_network_events
    result = CliRunner().invoke(app, ["list", "env"], env={"COLUMNS": "250"})
    docker = next(line for line in result.output.splitlines() if "│ docker" in line)
    assert "network_events" in docker


def test_summaries_of_several_sandboxes_add_up() -> None:
    main = EventLog(limit=2)
    for port in (1, 2, 3):
        main.add(_event("run", "tcp", "10.0.0.1", port))
    fresh = NetworkEvents(events=(_event("evaluation", "udp", "10.0.0.2", 53),))
    summary = summarize([main.snapshot(), fresh])
    assert {k: (v.refused, v.by_protocol) for k, v in summary.items()} == {
        "run": (3, {"tcp": 3}),
        "evaluation": (1, {"udp": 1}),
    }


def test_ipv6_multicast_control_is_not_an_attempt() -> None:
    events = EventLog(limit=10)
    events.feed(line("E", NOW_NS, "corral:run", 6, 58, "ff02::16", "-") + b"\n")
    events.feed(line("E", NOW_NS, "corral:run", 6, 17, "ff02::16", 5353) + b"\n")
    events.feed(line("E", NOW_NS, "corral:run", 6, 58, "fd00::1", "-") + b"\n")
    assert [(e.protocol, str(e.destination)) for e in events.snapshot().events] == [
        ("udp", "ff02::16"),
        ("icmpv6", "fd00::1"),
    ]
