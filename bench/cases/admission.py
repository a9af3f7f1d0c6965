"""Admission on `local` (issue 23, item 5): 4 processes open 64 sessions at once.

- `max_opens_per_s`: the most opens that began (the provider's `_open` called) in any 1 s
  window, across the 4 processes, against the limit; beside it the same burst with no rate.
- `admission="adaptive"` under an artificially strict threshold (25% idle CPU) while a CPU
  load (a busy process per core) runs for `LOAD_S`: how long each open waited, beside how
  long the load still had to run when it asked. None should start while the load runs.

The processes share a fresh runtime dir (the bucket's file), so no other run's rate counts.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import time
from contextlib import AsyncExitStack
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import anyio

from bench.context import Context
from bench.report import Row
from bench.stats import summarize
from corral.core.plan import ExecutionPlan
from corral.core.session import EnvironmentSession
from corral.providers.local import LocalConfig, LocalEnvironment

PROCESSES = 4
SESSIONS = 64
RATE_PER_S = 8.0
LOAD_S = 3.0
STRICT_IDLE_CPU_PERCENT = 25.0
#: Slack for the first reading after the load (it measures the last `MIN_INTERVAL_S`).
EARLY_S = 0.3

_BURNER = "import time\nend = time.monotonic() + {0}\nwhile time.monotonic() < end: pass\n"


class _Timed(LocalEnvironment):
    """`local`, noting when each open's provider work began (wall clock, comparable across
    processes)."""

    began: list[float]

    async def _open(
        self, plan: ExecutionPlan, owned: AsyncExitStack, *, session_id: str | None
    ) -> EnvironmentSession:
        self.began.append(time.time())
        return await super()._open(plan, owned, session_id=session_id)


async def _burst(count: int, config: dict[str, Any]) -> tuple[list[float], int]:
    env = _Timed(LocalConfig.model_validate(config))
    env.began = []
    sessions: list[EnvironmentSession] = []
    failed: list[BaseException] = []

    async def one() -> None:
        try:
            sessions.append(await env.open(ExecutionPlan()))
        except Exception as exc:
            failed.append(exc)

    async with anyio.create_task_group() as tg:
        for _ in range(count):
            tg.start_soon(one)
    for session in sessions:
        await env.close(session)
    return env.began, len(failed)


def _child(count: int, config: dict[str, Any], runtime: str, ready: Queue[Any], go: Event) -> None:
    os.environ["XDG_RUNTIME_DIR"] = runtime
    ready.put(None)
    go.wait()
    ready.put(anyio.run(_burst, count, config))


def burst(config: dict[str, Any], runtime: Path, *, load_s: float = 0.0) -> dict[str, Any]:
    """`SESSIONS` opens from `PROCESSES` processes released at once (after a CPU load has
    run for a moment, if `load_s`); when they were released, when each began, how many
    failed, and when the load ended."""
    mp = multiprocessing.get_context("spawn")
    ready: Queue[Any] = mp.Queue()
    go = mp.Event()
    each = SESSIONS // PROCESSES
    children = [
        mp.Process(target=_child, args=(each, config, str(runtime), ready, go))
        for _ in range(PROCESSES)
    ]
    for child in children:
        child.start()
    burners: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(PROCESSES):
            ready.get(timeout=120)
        if load_s:
            code = _BURNER.format(load_s)
            burners = [
                subprocess.Popen([sys.executable, "-c", code]) for _ in range(os.cpu_count() or 1)
            ]
            time.sleep(0.5)
        released = time.time()
        go.set()
        load_end = released
        for burner in burners:
            burner.wait()
            load_end = time.time()
        began: list[float] = []
        failed = 0
        for _ in range(PROCESSES):
            times, failures = ready.get(timeout=600)
            began += times
            failed += failures
    finally:
        for burner in burners:
            burner.kill()
        for child in children:
            child.join(timeout=60)
            if child.is_alive():
                child.kill()
    return {"released": released, "began": sorted(began), "failed": failed, "load_end": load_end}


def most_in_window(times: list[float], window_s: float = 1.0) -> int:
    """The most of `times` (sorted) in any half-open window [t, t + window_s)."""
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= window_s:
            first += 1
        most = max(most, last - first + 1)
    return most


async def run(ctx: Context) -> list[Row]:
    runtime = ctx.workspace / "admission-runtime"  # `local`: the engine is not used
    runtime.mkdir(mode=0o700, exist_ok=True)
    limited = await anyio.to_thread.run_sync(
        lambda: burst({"max_opens_per_s": RATE_PER_S}, runtime)
    )
    free = await anyio.to_thread.run_sync(lambda: burst({}, runtime))
    adaptive_config = {
        "admission": "adaptive",
        "admission_min_idle_cpu_percent": STRICT_IDLE_CPU_PERCENT,
        "admission_max_wait_s": 120.0,
    }
    loaded = await anyio.to_thread.run_sync(lambda: burst(adaptive_config, runtime, load_s=LOAD_S))

    most, most_free = most_in_window(limited["began"]), most_in_window(free["began"])
    span = limited["began"][-1] - limited["began"][0]
    rows = [
        Row(
            f"{SESSIONS} local opens from {PROCESSES} processes, max_opens_per_s={RATE_PER_S:g}: "
            "most opens begun in any 1 s",
            summarize([most]),
            "no rate",
            summarize([most_free]),
            unit="count",
            target=f"≤ {RATE_PER_S:g} (never above the rate)",
            met=most <= RATE_PER_S and limited["failed"] == 0,
            note=f"{len(limited['began'])} began over {span:.2f} s "
            f"({(len(limited['began']) - 1) / span:.2f}/s), {limited['failed']} failed",
        )
    ]
    waits = [at - loaded["released"] for at in loaded["began"]]
    left = loaded["load_end"] - loaded["released"]
    first_after_load = loaded["began"][0] - loaded["load_end"]
    rows.append(
        Row(
            f"{SESSIONS} local opens from {PROCESSES} processes, admission=adaptive with "
            f"min idle CPU {STRICT_IDLE_CPU_PERCENT:g}% during a {LOAD_S:g} s CPU load: "
            "wait before the open began",
            summarize(waits),
            "CPU load left when asked",
            summarize([left]),
            target="none begins while the load runs",
            met=first_after_load >= -EARLY_S and loaded["failed"] == 0,
            note=f"first began {first_after_load:+.2f} s after the load ended, last "
            f"{loaded['began'][-1] - loaded['load_end']:+.2f} s; {loaded['failed']} failed",
        )
    )
    return rows
