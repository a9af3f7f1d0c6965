"""Egress events: what a policy refused, and what it admitted, when, in which phase.

Where a provider can see them (Docker: every REJECT in the sandbox's namespace is
preceded by a rate-limited NFLOG rule, and so is every rule that admits a new flow, read
by corral's reader in the holder), each refused attempt and each admitted flow becomes a
`NetworkEvent` (`verdict`). The phase is the one the kernel's rules were rendered for
(`log_prefix`), so an attempt is stamped with the policy that decided it, however late it
is read. Refusals and admissions are kept apart, each bounded, so a flood of one never
pushes the other out.

Everything here is pure and bounded: `EventLog` keeps the newest `limit` events and counts
the rest; `parse_line` reads one line of the reader's output as hostile input (a line that
is not exactly what the reader prints is counted and dropped, never half-read).
"""

from __future__ import annotations

import ipaddress
import re
import threading
import time as _time
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from corral.network.policy import PHASES, Phase
from corral.network.targets import IPAddress

#: the nfnetlink_log group corral's rules log to (one per namespace: each holder has its own)
NFLOG_GROUP = 13
#: per rule: refused packets logged at most this often (the rest are refused, not listed)
LOG_RATE_PER_S = 500
LOG_BURST = 1000
#: bytes of each refused packet copied to the reader: the IP and transport headers
LOG_COPY_BYTES = 128
DEFAULT_LIMIT = 1000
#: how long a probe of corral's own is waited for in the log before it counts as the
#: workload's (it is logged within milliseconds of the dial)
OWN_PROBE_WINDOW_S = 10.0
_MAX_LINE = 200
_MAX_OWN = 16
_NO_PHASE = "none"
_PREFIX = "corral:"
_SAVED_PREFIX = re.compile(r'--nflog-prefix\s+"?(corral:[a-z_]+)')
#: the prefix's ending on rules that admit a flow (their NFLOG logs new flows only)
_ADMITTED = ":allowed"
Verdict = Literal["refused", "allowed"]
_PROTOCOLS = {1: "icmp", 6: "tcp", 17: "udp", 33: "dccp", 58: "icmpv6", 132: "sctp", 136: "udplite"}


def log_prefix(phase: Phase | None, verdict: Verdict = "refused") -> str:
    """The NFLOG prefix of rules rendered for `phase` (None: outside any phase) that log
    what they refuse or, `verdict="allowed"`, the new flows they admit."""
    if phase is not None and phase not in PHASES:
        raise ValueError(f"not a phase: {phase!r}")
    return f"{_PREFIX}{phase or _NO_PHASE}{_ADMITTED if verdict == 'allowed' else ''}"


def verdict_of_prefix(prefix: str) -> Verdict:
    return "allowed" if prefix.endswith(_ADMITTED) else "refused"


def phase_of_prefix(prefix: str) -> Phase | None:
    """The phase `log_prefix` wrote into `prefix`; ValueError for anything else."""
    if not prefix.startswith(_PREFIX):
        raise ValueError(f"not corral's log prefix: {prefix[:40]!r}")
    name = prefix[len(_PREFIX) :].removesuffix(_ADMITTED)
    if name == _NO_PHASE:
        return None
    for phase in PHASES:
        if name == phase:
            return phase
    raise ValueError(f"not a phase: {name[:40]!r}")


def phase_in_rules(saved: str) -> Phase | None:
    """The phase of the first corral NFLOG prefix in `iptables-save` text (None: none)."""
    found = _SAVED_PREFIX.search(saved)
    return phase_of_prefix(found.group(1)) if found else None


def protocol_name(number: int) -> str:
    return _PROTOCOLS.get(number, str(number))


class NetworkEvent(BaseModel):
    """One refused attempt (a packet the policy in force rejected), or one admitted flow
    (the first packet of a connection, or of a UDP flow, a rule of the policy accepted)."""

    model_config = ConfigDict(frozen=True)

    time: datetime
    phase: Phase | None
    protocol: str
    destination: IPAddress
    #: the destination port (TCP, UDP, SCTP, DCCP); None for protocols without one
    port: int | None
    verdict: Verdict = "refused"
    #: the policy's hostname this address was resolved for at apply time, where known
    name: str | None = None

    def __str__(self) -> str:
        host = f"[{self.destination}]" if self.destination.version == 6 else str(self.destination)
        where = host if self.port is None else f"{host}:{self.port}"
        named = f" ({self.name})" if self.name else ""
        return (
            f"{self.time.isoformat()} {self.phase or '-'} {self.verdict} {self.protocol} "
            f"{where}{named}"
        )


class PhaseSummary(BaseModel):
    """What one phase's policy refused and admitted, counted."""

    model_config = ConfigDict(frozen=True)

    #: every refused attempt the reader read in this phase, dropped ones included
    refused: int
    by_protocol: dict[str, int]
    #: among the events kept: the most refused destinations, `host:port/protocol` ->
    #: count (at most 20)
    top_destinations: dict[str, int]
    #: every admitted flow the reader read in this phase, dropped ones included
    allowed: int = 0
    #: among the admitted flows kept: the most reached destinations (a name where known),
    #: `host:port/protocol` -> count (at most 20)
    top_allowed: dict[str, int] = {}


class NetworkEvents(BaseModel):
    """What `session.network_events()` returns: the newest refused attempts and admitted
    flows, in order (the newest `limit` of each).

    `dropped`: older events let go to keep `limit`; `totals` still counts refusals (phase
    -> protocol -> attempts) and `allowed_totals` admissions, so a flood cannot hide that
    earlier ones happened. `lost`: events the reader could not keep up with (the kernel
    dropped them) or could not read. Attempts beyond the logging rate (`LOG_RATE_PER_S`
    per rule) are decided but never listed. `error` says why the reader stopped, if it
    stopped before the session closed.
    """

    model_config = ConfigDict(frozen=True)

    events: tuple[NetworkEvent, ...]
    dropped: int = 0
    lost: int = 0
    limit: int = DEFAULT_LIMIT
    error: str | None = None
    #: phase (`"none"` outside any) -> protocol -> refused attempts read, dropped included;
    #: empty: count the events kept
    totals: dict[str, dict[str, int]] = {}
    #: the same for admitted flows
    allowed_totals: dict[str, dict[str, int]] = {}

    def refused(self) -> tuple[NetworkEvent, ...]:
        return tuple(e for e in self.events if e.verdict == "refused")

    def allowed(self) -> tuple[NetworkEvent, ...]:
        return tuple(e for e in self.events if e.verdict == "allowed")

    def summary(self) -> dict[str, PhaseSummary]:
        return summarize([self])


def _totals(snapshot: NetworkEvents, verdict: Verdict) -> dict[str, Counter[str]]:
    given = snapshot.totals if verdict == "refused" else snapshot.allowed_totals
    if given:
        return {phase: Counter(counts) for phase, counts in given.items()}
    counted: dict[str, Counter[str]] = {}
    for item in snapshot.events:
        if item.verdict == verdict:
            counted.setdefault(item.phase or _NO_PHASE, Counter())[item.protocol] += 1
    return counted


def summarize(snapshots: Iterable[NetworkEvents]) -> dict[str, PhaseSummary]:
    """Per phase (`"none"` outside any), over one or more sandboxes' events: how many
    attempts were refused and flows admitted, by protocol, and where to."""
    totals: dict[Verdict, dict[str, Counter[str]]] = {"refused": {}, "allowed": {}}
    where: dict[Verdict, dict[str, Counter[str]]] = {"refused": {}, "allowed": {}}
    for snapshot in snapshots:
        for verdict, counted in totals.items():
            for phase, counts in _totals(snapshot, verdict).items():
                counted.setdefault(phase, Counter()).update(counts)
        for item in snapshot.events:
            where[item.verdict].setdefault(item.phase or _NO_PHASE, Counter())[_where(item)] += 1
    empty = Counter[str]()
    return {
        phase: PhaseSummary(
            refused=sum(totals["refused"].get(phase, empty).values()),
            by_protocol=dict(totals["refused"].get(phase, empty)),
            top_destinations=dict(where["refused"].get(phase, empty).most_common(20)),
            allowed=sum(totals["allowed"].get(phase, empty).values()),
            top_allowed=dict(where["allowed"].get(phase, empty).most_common(20)),
        )
        for phase in sorted(totals["refused"].keys() | totals["allowed"].keys())
    }


def _where(item: NetworkEvent) -> str:
    host = f"[{item.destination}]" if item.destination.version == 6 else str(item.destination)
    port = "" if item.port is None else f":{item.port}"
    return f"{item.name or host}{port}/{item.protocol}"


class ReaderLost(BaseModel):
    """`L <n>`: the reader's running count of messages the kernel dropped."""

    model_config = ConfigDict(frozen=True)

    total: int


class ReaderHello(BaseModel):
    model_config = ConfigDict(frozen=True)


ReaderLine = NetworkEvent | ReaderLost | ReaderHello


def _number(text: str, low: int, high: int) -> int:
    if not text.isascii() or not text.isdigit() or (len(text) > 1 and text[0] == "0"):
        raise ValueError(f"not a plain number: {text[:30]!r}")
    value = int(text)
    if not low <= value <= high:
        raise ValueError(f"{value} is outside {low}..{high}")
    return value


def parse_line(line: bytes) -> ReaderLine:
    """One line of the reader's output (without its newline); ValueError if it is not
    exactly one of the reader's three forms."""
    if len(line) > _MAX_LINE:
        raise ValueError(f"a line of {len(line)} bytes")
    try:
        text = line.decode("ascii")
    except UnicodeDecodeError:
        raise ValueError("a line that is not ASCII") from None
    fields = text.split(" ")
    kind = fields[0]
    if kind == "H" and fields == ["H", "1"]:
        return ReaderHello()
    if kind == "L" and len(fields) == 2:
        return ReaderLost(total=_number(fields[1], 1, 2**62))
    if kind != "E" or len(fields) != 7:
        raise ValueError(f"not a reader line: {text[:60]!r}")
    _, nanos, prefix, version, proto, destination, port = fields
    stamp = datetime.fromtimestamp(_number(nanos, 1, 2**62) / 1e9, tz=UTC)
    phase = phase_of_prefix(prefix)
    family = _number(version, 4, 6)
    if family == 5:
        raise ValueError("IP version 5")
    number = _number(proto, 0, 255)
    if "%" in destination:
        raise ValueError("a destination with a zone")
    address = ipaddress.ip_address(destination)  # ValueError for anything else
    if address.version != family or str(address) != destination:
        raise ValueError(f"destination {destination[:50]!r} is not a canonical IPv{family}")
    return NetworkEvent(
        time=stamp,
        phase=phase,
        protocol=protocol_name(number),
        destination=address,
        port=None if port == "-" else _number(port, 0, 65535),
        verdict=verdict_of_prefix(prefix),
    )


class EventLog:
    """The newest `limit` refused attempts and `limit` admitted flows of one sandbox, fed
    from a reader thread.

    Thread-safe; memory is bounded by `limit` events of each verdict, `_MAX_OWN` expected
    probes, one partial line and the names of the policy in force. Probes corral itself
    dials (`expect_own`) are taken out once each.
    """

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        self.limit = limit
        self._events: dict[Verdict, deque[NetworkEvent]] = {
            "refused": deque(maxlen=limit),
            "allowed": deque(maxlen=limit),
        }
        self._dropped = 0
        self._totals: dict[Verdict, dict[str, Counter[str]]] = {"refused": {}, "allowed": {}}
        self._names: dict[IPAddress, str] = {}
        self._lost_kernel = 0
        self._unreadable = 0
        self._own: deque[tuple[float, IPAddress, int, str]] = deque(maxlen=_MAX_OWN)
        self._partial = bytearray()
        self._skipping = False
        self._lock = threading.Lock()
        self.error: str | None = None

    def stopped(self, reason: str) -> None:
        """The reader ended for `reason`: what it would have fed is missing from now on."""
        self.error = reason

    def name_addresses(self, addresses: Mapping[str, Iterable[IPAddress]]) -> None:
        """The policy now in force resolved these names to these addresses: a flow to one
        is listed with its name from now on."""
        named = {address: name for name, found in addresses.items() for address in found}
        with self._lock:
            self._names = named

    def expect_own(self, destination: IPAddress, port: int, protocol: str = "tcp") -> None:
        """corral is about to dial `destination:port` itself (a probe): not the workload's."""
        with self._lock:
            self._own.append((_time.monotonic() + OWN_PROBE_WINDOW_S, destination, port, protocol))

    def feed(self, data: bytes) -> None:
        """Bytes of the reader's stdout, in any split; complete lines are taken in. A line
        longer than any the reader prints is counted once and skipped to its end."""
        with self._lock:
            while data:
                end = data.find(b"\n")
                piece, data = (data, b"") if end < 0 else (data[:end], data[end + 1 :])
                if not self._skipping:
                    self._partial += piece
                    if len(self._partial) > _MAX_LINE:
                        self._unreadable += 1
                        self._partial.clear()
                        self._skipping = True
                    elif end >= 0:
                        line = bytes(self._partial)
                        self._partial.clear()
                        self._take(line)
                if end >= 0:
                    self._skipping = False

    def _take(self, line: bytes) -> None:
        try:
            item = parse_line(line)
        except ValueError:
            self._unreadable += 1
            return
        if isinstance(item, ReaderLost):
            self._lost_kernel = max(self._lost_kernel, item.total)
        elif isinstance(item, NetworkEvent):
            self._add(item)

    def add(self, item: NetworkEvent) -> None:
        with self._lock:
            self._add(item)

    def _add(self, item: NetworkEvent) -> None:
        if item.protocol == "icmpv6" and item.destination.is_multicast:
            # The namespace's own IPv6 control traffic (MLD reports to ff02::16 when an
            # interface or a socket joins a group): no attempt to reach anything.
            return
        now = _time.monotonic()
        for entry in list(self._own):
            deadline, destination, port, protocol = entry
            if deadline < now:
                self._own.remove(entry)
            elif (destination, port, protocol) == (item.destination, item.port, item.protocol):
                self._own.remove(entry)
                return
        kept = self._events[item.verdict]
        if len(kept) == self.limit:
            self._dropped += 1
        name = self._names.get(item.destination)
        kept.append(item if name is None else item.model_copy(update={"name": name}))
        # Bounded: five phase names, at most 256 protocol names each.
        totals = self._totals[item.verdict]
        totals.setdefault(item.phase or _NO_PHASE, Counter())[item.protocol] += 1

    def snapshot(self) -> NetworkEvents:
        with self._lock:
            events = sorted((*self._events["refused"], *self._events["allowed"]), key=_when)
            totals = self._totals
            return NetworkEvents(
                events=tuple(events),
                dropped=self._dropped,
                lost=self._lost_kernel + self._unreadable,
                limit=self.limit,
                error=self.error,
                totals={phase: dict(counts) for phase, counts in totals["refused"].items()},
                allowed_totals={phase: dict(counts) for phase, counts in totals["allowed"].items()},
            )


def _when(item: NetworkEvent) -> datetime:
    return item.time
