"""Denied-egress events: what a policy refused, when, and in which phase.

Where a provider can see refusals (Docker: every REJECT in the sandbox's namespace is
preceded by a rate-limited NFLOG rule, read by corral's reader in the holder), each
refused attempt becomes a `NetworkEvent`. The phase is the one the kernel's rules were
rendered for (`log_prefix`), so an attempt is stamped with the policy that refused it,
however late it is read.

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
from collections.abc import Iterable
from datetime import UTC, datetime

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
_PROTOCOLS = {1: "icmp", 6: "tcp", 17: "udp", 33: "dccp", 58: "icmpv6", 132: "sctp", 136: "udplite"}


def log_prefix(phase: Phase | None) -> str:
    """The NFLOG prefix of rules rendered for `phase` (None: outside any phase)."""
    if phase is not None and phase not in PHASES:
        raise ValueError(f"not a phase: {phase!r}")
    return f"{_PREFIX}{phase or _NO_PHASE}"


def phase_of_prefix(prefix: str) -> Phase | None:
    """The phase `log_prefix` wrote into `prefix`; ValueError for anything else."""
    if not prefix.startswith(_PREFIX):
        raise ValueError(f"not corral's log prefix: {prefix[:40]!r}")
    name = prefix[len(_PREFIX) :]
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
    """One refused attempt: a packet the policy in force rejected."""

    model_config = ConfigDict(frozen=True)

    time: datetime
    phase: Phase | None
    protocol: str
    destination: IPAddress
    #: the destination port (TCP, UDP, SCTP, DCCP); None for protocols without one
    port: int | None

    def __str__(self) -> str:
        host = f"[{self.destination}]" if self.destination.version == 6 else str(self.destination)
        where = host if self.port is None else f"{host}:{self.port}"
        return f"{self.time.isoformat()} {self.phase or '-'} {self.protocol} {where}"


class PhaseSummary(BaseModel):
    """The refused attempts of one phase, counted."""

    model_config = ConfigDict(frozen=True)

    #: every refused attempt the reader read in this phase, dropped ones included
    refused: int
    by_protocol: dict[str, int]
    #: among the events kept: the most refused destinations, `host:port/protocol` ->
    #: count (at most 20)
    top_destinations: dict[str, int]


class NetworkEvents(BaseModel):
    """What `session.network_events()` returns: the newest refused attempts, in order.

    `dropped`: older events let go to keep `limit`; `totals` still counts them (phase ->
    protocol -> attempts), so a flood cannot hide that earlier attempts happened. `lost`:
    events the reader could not keep up with (the kernel dropped them) or could not read.
    Attempts beyond the logging rate (`LOG_RATE_PER_S` per rule) are refused but never
    listed. `error` says why the reader stopped, if it stopped before the session closed.
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

    def summary(self) -> dict[str, PhaseSummary]:
        return summarize([self])


def _totals(snapshot: NetworkEvents) -> dict[str, Counter[str]]:
    if snapshot.totals:
        return {phase: Counter(counts) for phase, counts in snapshot.totals.items()}
    counted: dict[str, Counter[str]] = {}
    for item in snapshot.events:
        counted.setdefault(item.phase or _NO_PHASE, Counter())[item.protocol] += 1
    return counted


def summarize(snapshots: Iterable[NetworkEvents]) -> dict[str, PhaseSummary]:
    """Per phase (`"none"` outside any), over one or more sandboxes' events: how many
    were refused, by protocol, and where to."""
    totals: dict[str, Counter[str]] = {}
    where: dict[str, Counter[str]] = {}
    for snapshot in snapshots:
        for phase, counts in _totals(snapshot).items():
            totals.setdefault(phase, Counter()).update(counts)
        for item in snapshot.events:
            where.setdefault(item.phase or _NO_PHASE, Counter())[_where(item)] += 1
    return {
        phase: PhaseSummary(
            refused=sum(counts.values()),
            by_protocol=dict(counts),
            top_destinations=dict(where.get(phase, Counter[str]()).most_common(20)),
        )
        for phase, counts in totals.items()
    }


def _where(item: NetworkEvent) -> str:
    host = f"[{item.destination}]" if item.destination.version == 6 else str(item.destination)
    port = "" if item.port is None else f":{item.port}"
    return f"{host}{port}/{item.protocol}"


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
    )


class EventLog:
    """The newest `limit` refused attempts of one sandbox, fed from a reader thread.

    Thread-safe; memory is bounded by `limit` events, `_MAX_OWN` expected probes and one
    partial line. Probes corral itself dials (`expect_own`) are taken out once each.
    """

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        self.limit = limit
        self._events: deque[NetworkEvent] = deque(maxlen=limit)
        self._dropped = 0
        self._totals: dict[str, Counter[str]] = {}
        self._lost_kernel = 0
        self._unreadable = 0
        self._own: deque[tuple[float, IPAddress, int, str]] = deque(maxlen=_MAX_OWN)
        self._partial = bytearray()
        self._skipping = False
        self._lock = threading.Lock()
        self.error: str | None = None

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
        if len(self._events) == self.limit:
            self._dropped += 1
        self._events.append(item)
        # Bounded: five phase names, at most 256 protocol names each.
        self._totals.setdefault(item.phase or _NO_PHASE, Counter())[item.protocol] += 1

    def snapshot(self) -> NetworkEvents:
        with self._lock:
            return NetworkEvents(
                events=tuple(self._events),
                dropped=self._dropped,
                lost=self._lost_kernel + self._unreadable,
                limit=self.limit,
                error=self.error,
                totals={phase: dict(counts) for phase, counts in self._totals.items()},
            )
