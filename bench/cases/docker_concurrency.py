"""64 concurrent sessions, each open → 10 execs → close: wall time, failures, leaked
resources, and the event loop's worst lag (a ticker task; blocking calls on the loop show
up here, beside a separate idle process's lag, which is the host's alone). Baseline: the
same work with raw docker-py in 64 threads, no enforcement."""

from __future__ import annotations

import functools
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import docker

from bench.cases.docker_exec import corral_exec, raw_exec
from bench.context import RAW, TEST_IMAGE, Context, timed
from bench.lag import HostLag, LagMonitor
from bench.report import Row
from bench.stats import summarize

SESSIONS = 64
EXECS = 10
LAG_TARGET_S = 0.050
RAW_TIMEOUT_S = 600


def _raw_session(api: Any) -> None:
    container = api.create_container(TEST_IMAGE, ["sleep", "infinity"], labels={RAW: "1"})["Id"]
    try:
        api.start(container)
        for _ in range(EXECS):
            raw_exec(api, container, ["true"])
    finally:
        api.remove_container(container, force=True, v=True)


def _raw_all() -> int:
    """A client with a connection per thread, as corral's (max_pool_size=max_workers), and
    a timeout long enough for a saturated engine; returns how many sessions failed."""
    api: Any = docker.APIClient(max_pool_size=SESSIONS, timeout=RAW_TIMEOUT_S)
    try:
        with ThreadPoolExecutor(SESSIONS) as pool:
            futures = [pool.submit(_raw_session, api) for _ in range(SESSIONS)]
            return sum(future.exception() is not None for future in futures)
    finally:
        api.close()


async def _session(ctx: Context, failed: list[Exception]) -> None:
    try:
        async with ctx.env.session(ctx.plan("no-network")) as session:
            for _ in range(EXECS):
                await corral_exec(session, ["true"])
    except Exception as exc:
        failed.append(exc)


async def _all_sessions(ctx: Context, failed: list[Exception]) -> None:
    async with anyio.create_task_group() as tg:
        for _ in range(SESSIONS):
            tg.start_soon(_session, ctx, failed)


async def run(ctx: Context) -> list[Row]:
    walls: list[float] = []
    raw_walls: list[float] = []
    failures: list[float] = []
    leaks: list[float] = []
    lags: list[float] = []
    host_lags: list[float] = []
    errors: list[Exception] = []
    raw_failures = 0
    for _ in range(ctx.reps(3, minimum=1)):
        failed: list[Exception] = []
        monitor = LagMonitor()
        async with HostLag() as host, anyio.create_task_group() as tg:
            tg.start_soon(monitor.run)
            walls.append(await timed(functools.partial(_all_sessions, ctx, failed)))
            tg.cancel_scope.cancel()
        host_lags.append(host.worst_s)
        failures.append(len(failed))
        errors += failed
        leaks.append(len(ctx.leaks()))
        lags.append(monitor.worst_s)
        await ctx.reset()
        started = time.perf_counter()
        raw_failures += _raw_all()
        raw_walls.append(time.perf_counter() - started)
        await ctx.reset()
    failed_none, no_leaks = not any(failures), not any(leaks)
    label = f"{SESSIONS} sessions x (open, {EXECS} execs, close)"
    return [
        Row(
            f"{label}: wall",
            summarize(walls),
            "docker-py, 64 threads",
            summarize(raw_walls),
            note=f"{raw_failures} docker-py sessions failed" if raw_failures else "",
        ),
        Row(
            f"{label}: failures",
            summarize(failures),
            unit="count",
            target="0",
            met=failed_none,
            note=f"first: {errors[0]!r}" if errors else "",
        ),
        Row(f"{label}: leaked resources", summarize(leaks), unit="count", target="0", met=no_leaks),
        Row(
            f"{label}: event-loop worst lag",
            summarize(lags),
            "a separate idle process's worst lag",
            summarize(host_lags),
            target=f"≤ {LAG_TARGET_S * 1000:.0f} ms",
            met=max(lags) <= LAG_TARGET_S,
        ),
    ]
