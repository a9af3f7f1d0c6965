"""64 concurrent sessions, each open → 10 execs → close, three rounds (then 300 at once,
one round; --quick: 32, one round): wall time, each open's time (its wait for the open
limiter included), failures, leaked resources, and the event loop's worst lag (a ticker
task; blocking calls on the loop show up here, beside a separate idle process's lag,
which is the host's alone). Baseline: the same work with raw docker-py in as many
threads, no enforcement; its open is create + start."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import docker

from bench.cases.docker_exec import corral_exec, raw_exec
from bench.cases.docker_open import make_objects, remove_objects
from bench.context import RAW, TEST_IMAGE, Context, timed
from bench.lag import HostLag, LagMonitor
from bench.report import Row, ratio_at_most
from bench.stats import summarize

SESSIONS = 64
#: issue 23: 300 sessions at once on one engine, wall at most WALL_TARGET x raw threads
MANY = 300
WALL_TARGET = 1.2
EXECS = 10
LAG_TARGET_S = 0.050
RAW_TIMEOUT_S = 600


#: Makes one session's objects, started: (networks, containers), the last one exec'd into.
Make = Callable[[Any], tuple[list[str], list[str]]]


def _one_container(api: Any) -> tuple[list[str], list[str]]:
    container = api.create_container(TEST_IMAGE, ["sleep", "infinity"], labels={RAW: "1"})["Id"]
    try:
        api.start(container)
    except BaseException:
        remove_objects(api, [], [container])
        raise
    return [], [container]


def _raw_session(api: Any, opens: list[float], make: Make) -> None:
    started = time.perf_counter()
    networks, containers = make(api)
    try:
        opens.append(time.perf_counter() - started)
        for _ in range(EXECS):
            raw_exec(api, containers[-1], ["true"])
    finally:
        remove_objects(api, networks, containers)


def _raw_all(sessions: int, opens: list[float], make: Make = _one_container) -> int:
    """A client with a connection per thread, as corral's (max_pool_size=max_workers), and
    a timeout long enough for a saturated engine; returns how many sessions failed."""
    api: Any = docker.APIClient(max_pool_size=sessions, timeout=RAW_TIMEOUT_S)
    try:
        with ThreadPoolExecutor(sessions) as pool:
            futures = [pool.submit(_raw_session, api, opens, make) for _ in range(sessions)]
            return sum(future.exception() is not None for future in futures)
    finally:
        api.close()


async def _session(ctx: Context, failed: list[Exception], opens: list[float]) -> None:
    started = time.perf_counter()
    try:
        async with ctx.env.session(ctx.plan("no-network")) as session:
            opens.append(time.perf_counter() - started)
            for _ in range(EXECS):
                await corral_exec(session, ["true"])
    except Exception as exc:
        failed.append(exc)


async def _all_sessions(
    ctx: Context, sessions: int, failed: list[Exception], opens: list[float]
) -> None:
    async with anyio.create_task_group() as tg:
        for _ in range(sessions):
            tg.start_soon(_session, ctx, failed, opens)


async def run(ctx: Context) -> list[Row]:
    # --quick stays under its ten minutes: half the sessions, one round, and the design's
    # floor (a network and holder per session) left out.
    full = ctx.scale >= 1
    sessions = SESSIONS if full else SESSIONS // 2
    rows = await _rows(ctx, sessions, ctx.reps(3, minimum=1), floor=full)
    if ctx.scale >= 1:
        rows += await _rows(ctx, MANY, 1)
    return rows


async def _rows(ctx: Context, sessions: int, rounds: int, *, floor: bool = False) -> list[Row]:
    walls: list[float] = []
    raw_walls: list[float] = []
    floor_walls: list[float] = []
    failures: list[float] = []
    leaks: list[float] = []
    lags: list[float] = []
    host_lags: list[float] = []
    errors: list[Exception] = []
    opens: list[float] = []
    raw_opens: list[float] = []
    raw_failures = 0
    monitors: list[LagMonitor] = []
    for _ in range(rounds):
        failed: list[Exception] = []
        monitor = LagMonitor()
        monitors.append(monitor)
        async with HostLag() as host, anyio.create_task_group() as tg:
            tg.start_soon(monitor.run)
            run_all = functools.partial(_all_sessions, ctx, sessions, failed, opens)
            walls.append(await timed(run_all))
            tg.cancel_scope.cancel()
        host_lags.append(host.worst_s)
        failures.append(len(failed))
        errors += failed
        leaks.append(len(ctx.leaks()))
        lags.append(monitor.worst_s)
        await ctx.reset()
        started = time.perf_counter()
        raw_failures += _raw_all(sessions, raw_opens)
        raw_walls.append(time.perf_counter() - started)
        await ctx.reset()
        if floor:
            started = time.perf_counter()
            raw_failures += _raw_all(sessions, [], make_objects)
            floor_walls.append(time.perf_counter() - started)
            await ctx.reset()
    failed_none, no_leaks = not any(failures), not any(leaks)
    label = f"{sessions} sessions x (open, {EXECS} execs, close)"
    baseline = f"docker-py, {sessions} threads"
    floor_rows: list[Row] = []
    floor_note = ""
    if floor_walls:
        floor_s = summarize(floor_walls)
        floor_rows.append(
            Row(
                f"{label}: wall",
                summarize(walls),
                f"{baseline}, corral's three objects each, no rules (the design's floor)",
                floor_s,
            )
        )
        ratio = floor_s.median / summarize(raw_walls).median
        floor_note = f"floor: docker-py's sessions of corral's three objects are {ratio:.2f}x"
    failed_raw = f"{raw_failures} docker-py sessions failed" if raw_failures else ""
    return [
        Row(
            f"{label}: wall",
            summarize(walls),
            baseline,
            summarize(raw_walls),
            target=f"≤ {WALL_TARGET}x",
            met=ratio_at_most(summarize(walls), summarize(raw_walls), WALL_TARGET),
            note="; ".join(n for n in (floor_note, failed_raw) if n),
        ),
        *floor_rows,
        Row(
            f"{label}: open",
            summarize(opens or [0.0]),
            f"{baseline}: create + start",
            summarize(raw_opens or [0.0]),
            note=f"no-network enforced and probed; the wait for the limit of "
            f"{type(ctx.env).max_concurrent_opens} opens included",
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
            note=max(monitors, key=lambda m: m.gc_worst_s).gc_note(),
        ),
    ]
