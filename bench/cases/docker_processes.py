"""Processes on Docker: `start` to the first byte of output and a persistent shell's
`run("true")`, each beside an exec of the same through the exec channel on the same
sandbox; and 1,000 background processes started and then killed in one sandbox. Issue
21's target: `shell.run` at most 1.2x the channel's exec."""

from __future__ import annotations

import functools
import time

import anyio

from bench.context import Context, timed
from bench.report import Row, ratio_at_most
from bench.stats import summarize
from corral.core.processes import ProcessOutput
from corral.core.session import EnvironmentSession
from corral.core.shell import Shell

WARMUP = 5
SHELL_TARGET = 1.2
MANY = 1000


async def _first_byte(session: EnvironmentSession) -> None:
    proc = await session.start(["echo", "x"])
    async for event in proc:
        if isinstance(event, ProcessOutput):
            break
    await proc.wait()


async def _exec(session: EnvironmentSession, argv: list[str]) -> None:
    result = await session.exec(argv)
    if result.returncode != 0:
        raise RuntimeError(f"exec of {argv} failed: {result.stderr}")


async def _shell(shell: Shell) -> None:
    result = await shell.run("true")
    if result.returncode != 0:
        raise RuntimeError(f"shell.run failed: {result.stderr}")


async def _many(session: EnvironmentSession, count: int) -> tuple[float, float]:
    started = time.perf_counter()
    procs = [await session.start(["sleep", "600"]) for _ in range(count)]
    made = time.perf_counter() - started
    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for proc in procs:
            tg.start_soon(proc.kill)
    return made, time.perf_counter() - started


async def run(ctx: Context) -> list[Row]:
    rows: list[Row] = []
    async with ctx.env.session(ctx.plan()) as session, await session.shell() as shell:
        first: list[float] = []
        runs: list[float] = []
        execs: list[float] = []
        for rep in range(WARMUP + ctx.reps(100)):
            samples = (
                await timed(functools.partial(_first_byte, session)),
                await timed(functools.partial(_shell, shell)),
                await timed(functools.partial(_exec, session, ["true"])),
            )
            if rep >= WARMUP:
                first.append(samples[0])
                runs.append(samples[1])
                execs.append(samples[2])
        channel = summarize(execs)
        rows.append(Row("start → first output byte", summarize(first), "channel exec", channel))
        mine = summarize(runs)
        rows.append(
            Row(
                'shell.run("true")',
                mine,
                "channel exec `true`",
                channel,
                target=f"p50 ≤ {SHELL_TARGET}x channel exec",
                met=ratio_at_most(mine, channel, SHELL_TARGET),
            )
        )
        count = max(50, ctx.reps(MANY))
        made, killed = await _many(session, count)
        rows.append(
            Row(
                f"{count} background processes: start all, then kill all",
                summarize([made]),
                "kill all",
                summarize([killed]),
                note=f"per process: {made / count * 1e3:.1f} ms to start, "
                f"{killed / count * 1e3:.1f} ms to kill",
            )
        )
    return rows
