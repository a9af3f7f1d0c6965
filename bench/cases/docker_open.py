"""A sandbox's whole life: corral open (no-network enforced) → first exec → close, vs raw
docker-py create+start+exec+remove of one container with no enforcement at all."""

from __future__ import annotations

from typing import Any

from bench.context import RAW, TEST_IMAGE, Context, timed, timed_sync
from bench.report import Row, ratio_at_most
from bench.stats import summarize

WARMUP = 1
TARGET = 1.3


def raw_cycle(api: Any) -> None:
    """create+start+exec+remove on the default bridge, as a harness without corral would."""
    container = api.create_container(TEST_IMAGE, ["sleep", "infinity"], labels={RAW: "1"})["Id"]
    try:
        api.start(container)
        exec_id = api.exec_create(container, ["true"])["Id"]
        api.exec_start(exec_id)
        if api.exec_inspect(exec_id)["ExitCode"] != 0:
            raise RuntimeError("raw exec failed")
    finally:
        api.remove_container(container, force=True, v=True)


async def run(ctx: Context) -> list[Row]:
    plan = ctx.plan("no-network")

    async def cycle() -> None:
        async with ctx.env.session(plan) as session:
            await session.exec(["true"])

    corral: list[float] = []
    raw: list[float] = []
    for rep in range(WARMUP + ctx.reps(15)):
        samples = await timed(cycle), timed_sync(lambda: raw_cycle(ctx.raw))
        if rep >= WARMUP:
            corral.append(samples[0])
            raw.append(samples[1])
    mine, theirs = summarize(corral), summarize(raw)
    return [
        Row(
            "open → exec → close, no-network",
            mine,
            "docker-py create+start+exec+remove",
            theirs,
            target=f"p50 ≤ {TARGET}x",
            met=ratio_at_most(mine, theirs, TARGET),
        )
    ]
