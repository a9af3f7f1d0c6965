"""Warm open (a pooled sandbox, baseline already enforced) vs cold open, same plan; and the
whole warm life (open → exec → close) against the raw docker-py cycle."""

from __future__ import annotations

from bench.cases.docker_open import raw_cycle
from bench.context import Context, timed, timed_sync
from bench.report import Row, ratio_at_most
from bench.stats import summarize
from corral.core.session import EnvironmentSession

WARMUP = 1
POOL_SIZE = 2
TARGET_VS_COLD = 0.1
TARGET_VS_RAW = 1.3


async def run(ctx: Context) -> list[Row]:
    env, plan = ctx.env, ctx.plan("no-network")
    opened: list[EnvironmentSession] = []

    async def open_one() -> None:
        opened.append(await env.open(plan))

    async def close_all() -> None:
        while opened:
            await env.close(opened.pop())

    cold: list[float] = []
    for rep in range(WARMUP + ctx.reps(15)):
        sample = await timed(open_one)
        await close_all()
        if rep >= WARMUP:
            cold.append(sample)

    warm: list[float] = []
    warm_cycle: list[float] = []
    raw: list[float] = []
    async with env.warm_pool(plan, size_per_key=POOL_SIZE) as pool:
        for rep in range(WARMUP + ctx.reps(15)):
            await pool.ready()
            sample = await timed(open_one)
            await close_all()
            await pool.ready()

            async def life() -> None:
                async with env.session(plan) as session:
                    await session.exec(["true"])

            samples = sample, await timed(life), timed_sync(lambda: raw_cycle(ctx.raw))
            if rep >= WARMUP:
                warm.append(samples[0])
                warm_cycle.append(samples[1])
                raw.append(samples[2])
        hits = pool.hits
    warm_s, cold_s = summarize(warm), summarize(cold)
    cycle_s, raw_s = summarize(warm_cycle), summarize(raw)
    return [
        Row(
            "open, no-network: warm (pooled) vs cold",
            warm_s,
            "corral cold open",
            cold_s,
            target=f"p50 ≤ {TARGET_VS_COLD}x",
            met=ratio_at_most(warm_s, cold_s, TARGET_VS_COLD),
            note=f"{hits} pool hits",
        ),
        Row(
            "warm open → exec → close, no-network",
            cycle_s,
            "docker-py create+start+exec+remove",
            raw_s,
            target=f"p50 ≤ {TARGET_VS_RAW}x",
            met=ratio_at_most(cycle_s, raw_s, TARGET_VS_RAW),
        ),
    ]
