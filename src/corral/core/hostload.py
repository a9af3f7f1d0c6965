"""How much memory and CPU this host has free, read from `/proc` (blocking: call it from a
worker thread).

Free memory is `MemAvailable` (what the kernel can hand out without swapping, page cache
included), free CPU the share of all CPUs' time spent idle (or waiting for I/O) since the
previous reading. A host's `/proc` is read, so a harness in a container sees the host's
figures unless the container's runtime virtualises them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

from corral.errors import ConfigError

#: The shortest interval free CPU is measured over: long enough for a few hundred ticks.
MIN_INTERVAL_S = 0.25
#: A previous reading older than this says nothing of now; free CPU is measured afresh.
STALE_S = 5.0


@dataclass(frozen=True)
class HostReading:
    free_memory_mb: float
    idle_cpu_percent: float
    #: `time.monotonic()` when it was taken
    at: float


def _mem_available_mb(text: str) -> float:
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024  # kB
    raise ValueError("no MemAvailable line")


def _cpu_times(text: str) -> tuple[int, int]:
    """(idle + iowait, total) ticks of all CPUs, from the first line of /proc/stat."""
    fields = text.split("\n", 1)[0].split()
    if not fields or fields[0] != "cpu":
        raise ValueError("no aggregate cpu line")
    ticks = [int(value) for value in fields[1:]]
    # user nice system idle iowait irq softirq steal [guest guest_nice, already in user/nice]
    return ticks[3] + ticks[4], sum(ticks[:8])


class HostProbe:
    """Readings of this host, thread-safe; free CPU is measured between two of them."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc
        self._lock = threading.Lock()
        self._last: tuple[float, int, int] | None = None  # (at, idle, total)
        self._reading: HostReading | None = None

    def read(self, *, fresh: bool = False) -> HostReading:
        """The latest reading: the last one if it is under `MIN_INTERVAL_S` old (unless
        `fresh`), else a new one, which may sleep up to `MIN_INTERVAL_S` to measure CPU."""
        with self._lock:
            now = time.monotonic()
            if self._reading is not None and not fresh and now - self._reading.at < MIN_INTERVAL_S:
                return self._reading
            if self._last is None or now - self._last[0] > STALE_S:
                self._last = self._sample()
            wait = self._last[0] + MIN_INTERVAL_S - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            at, idle, total = self._sample()
            _, idle0, total0 = self._last
            elapsed = total - total0
            idle_percent = 100.0 * (idle - idle0) / elapsed if elapsed > 0 else 0.0
            self._last = (at, idle, total)
            self._reading = HostReading(self._memory_mb(), max(0.0, min(100.0, idle_percent)), at)
            return self._reading

    def _sample(self) -> tuple[float, int, int]:
        try:
            idle, total = _cpu_times((self.proc / "stat").read_text())
        except (OSError, ValueError, IndexError) as exc:
            raise ConfigError(
                f"admission='adaptive' reads {self.proc}/stat, which this host does not give "
                f"({exc}); use admission='static'"
            ) from exc
        return time.monotonic(), idle, total

    def _memory_mb(self) -> float:
        try:
            return _mem_available_mb((self.proc / "meminfo").read_text())
        except (OSError, ValueError, IndexError) as exc:
            raise ConfigError(
                f"admission='adaptive' reads MemAvailable from {self.proc}/meminfo, which this "
                f"host does not give ({exc}); use admission='static'"
            ) from exc
