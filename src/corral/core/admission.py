"""Admission of opens: when a new sandbox may start being made.

`BaseEnvironment.open` admits each new sandbox inside the provider's per-process limiter
(`max_concurrent_opens`) and right before the provider starts making it, so that what is
admitted is what starts. Two gates, both off by default:

- `admission="adaptive"`: the open waits while the host's free memory
  (`admission_min_free_memory_mb`) or free CPU (`admission_min_idle_cpu_percent`) is
  below its threshold. Once one open of a process has had to wait, the opens of that
  process are let through one at a time, each on a reading taken after the previous one
  went (every `hostload.MIN_INTERVAL_S` at most), so a recovered host is not handed every
  waiting open at once on one reading.
- `max_opens_per_s`: a rate of opens shared by every process of this user on this host
  (`openrate`), the last gate before the provider's work.

The wait in both is bounded by `admission_max_wait_s`, after which the open fails with
`AdmissionTimeout` naming the gate. Like the wait for the concurrency limiter, it is not
part of `timeouts.startup_s`, which bounds the provider's own work. Readings and the
shared file are read in worker threads; a cancelled open stops waiting at once, and the
cancellation is raised, never swallowed. Each wait is logged (`corral.admission`) when it
begins, with the figures that cause it, and once more when the open is admitted.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

import anyio
import anyio.to_thread

from corral.core.blocking import limiter, run_stoppable
from corral.core.config import RuntimeEnvironmentConfig
from corral.core.hostload import HostProbe, HostReading
from corral.core.logs import event
from corral.core.openrate import OpenRateBucket, state_path
from corral.errors import AdmissionTimeout

log = logging.getLogger("corral.admission")

#: Worker threads admission may use at once in one process.
THREADS = 4
#: How often a waiting open reads the host again.
POLL_S = 0.25

HOST = HostProbe()


class ReadHost(Protocol):
    """A reading of the host (blocking); `fresh=True` asks for one taken after the call."""

    def __call__(self, *, fresh: bool) -> HostReading: ...


class Admission:
    """The gates `config` asks for, for one open of `provider`."""

    def __init__(
        self,
        provider: str,
        config: RuntimeEnvironmentConfig,
        *,
        read_host: ReadHost | None = None,
        state_dir: Path | None = None,
    ) -> None:
        self.provider = provider
        self.config = config
        self.read_host: ReadHost = read_host or HOST.read
        self.state_dir = state_dir
        self._waiting_for = ""

    @property
    def gated(self) -> bool:
        return self.config.admission == "adaptive" or self.config.max_opens_per_s is not None

    async def admit(self) -> None:
        """Return once the open may start; `AdmissionTimeout` after `admission_max_wait_s`."""
        if not self.gated:
            return
        started = anyio.current_time()
        bound = self.config.admission_max_wait_s
        host_s = rate_s = 0.0
        with anyio.move_on_after(bound) as scope:
            if self.config.admission == "adaptive":
                host_s = await self._host()
            if self.config.max_opens_per_s is not None:
                rate_s = await self._rate(self.config.max_opens_per_s)
        if scope.cancelled_caught:
            event(
                log,
                "warning",
                "open not admitted",
                provider=self.provider,
                waiting_for=self._waiting_for,
                waited_s=round(anyio.current_time() - started, 3),
            )
            raise AdmissionTimeout(
                f"provider {self.provider!r}: an open waited admission_max_wait_s={bound} for "
                f"{self._waiting_for} and was not admitted; raise admission_max_wait_s, lower "
                "the thresholds or the number of opens at once"
            )
        if host_s or rate_s:
            event(
                log,
                "info",
                "open admitted",
                provider=self.provider,
                waited_s=round(anyio.current_time() - started, 3),
                host_wait_s=round(host_s, 3),
                rate_wait_s=round(rate_s, 3),
            )

    # adaptive

    def _short(self, reading: HostReading) -> list[str]:
        short: list[str] = []
        if reading.free_memory_mb < self.config.admission_min_free_memory_mb:
            short.append("memory")
        if reading.idle_cpu_percent < self.config.admission_min_idle_cpu_percent:
            short.append("cpu")
        return short

    async def _read(self, *, fresh: bool) -> HostReading:
        def read() -> HostReading:
            return self.read_host(fresh=fresh)

        return await anyio.to_thread.run_sync(read, limiter=limiter("admission", THREADS))

    async def _host(self) -> float:
        """Seconds waited for the host to have enough free memory and CPU."""
        self._waiting_for = "the host's free memory and CPU"
        queue = limiter(f"admission:host:{self.provider}", 1)
        if queue.borrowed_tokens == 0 and not self._short(await self._read(fresh=False)):
            return 0.0
        started = anyio.current_time()
        async with queue:
            logged = False
            while True:
                reading = await self._read(fresh=True)
                short = self._short(reading)
                if not short:
                    return anyio.current_time() - started
                self._waiting_for = (
                    f"the host's free {' and '.join(short)} "
                    f"({reading.free_memory_mb:.0f} MB, {reading.idle_cpu_percent:.0f}% idle CPU "
                    f"when last read)"
                )
                if not logged:
                    logged = True
                    event(
                        log,
                        "info",
                        "open waits for host resources",
                        provider=self.provider,
                        short=",".join(short),
                        free_memory_mb=round(reading.free_memory_mb),
                        min_free_memory_mb=self.config.admission_min_free_memory_mb,
                        idle_cpu_percent=round(reading.idle_cpu_percent, 1),
                        min_idle_cpu_percent=self.config.admission_min_idle_cpu_percent,
                        max_wait_s=self.config.admission_max_wait_s,
                    )
                await anyio.sleep(POLL_S)

    # rate

    async def _rate(self, rate_per_s: float) -> float:
        """Seconds waited for a token of the shared bucket."""
        self._waiting_for = f"a token of max_opens_per_s={rate_per_s}"

        def make() -> OpenRateBucket:
            return OpenRateBucket(state_path(self.provider, self.state_dir), rate_per_s)

        bucket = await anyio.to_thread.run_sync(make, limiter=limiter("admission", THREADS))
        path = bucket.path
        started = anyio.current_time()
        logged = False
        # One open of this process at a time asks the file: the others queue here, in order.
        async with limiter(f"admission:rate:{path}", 1):
            while True:
                take = await run_stoppable("admission", THREADS, bucket.try_take)
                if take.rebuilt is not None:
                    event(
                        log,
                        "warning",
                        "open rate state rebuilt with no token",
                        provider=self.provider,
                        reason=take.rebuilt,
                        state=path,
                    )
                if take.taken:
                    return anyio.current_time() - started if logged else 0.0
                if not logged:
                    logged = True
                    event(
                        log,
                        "info",
                        "open waits for the shared open rate",
                        provider=self.provider,
                        max_opens_per_s=rate_per_s,
                        next_token_s=round(take.wait_s, 3),
                        state=path,
                    )
                await anyio.sleep(take.wait_s)
