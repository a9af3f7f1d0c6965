"""set_network_policy latency through the cycle public → allowlist → no-network, beside the
floor every switch pays: one raw docker-py exec round trip in the holder."""

from __future__ import annotations

from bench.cases.docker_exec import raw_exec
from bench.context import Context, timed, timed_sync
from bench.report import Row
from bench.stats import summarize
from corral.providers.docker.session import DockerSession

CYCLE = ("public", "allowlist:192.0.2.10:443", "no-network")
WARMUP = 2
TARGET_S = 0.100


def _mode(policy: str) -> str:
    return policy.split(":")[0]


async def run(ctx: Context) -> list[Row]:
    switches: dict[str, list[float]] = {policy: [] for policy in CYCLE}
    floor: list[float] = []
    async with ctx.env.session(ctx.plan("no-network")) as session:
        assert isinstance(session, DockerSession)
        holder = session.net.holder
        for rep in range(WARMUP + ctx.reps(30)):
            for policy in CYCLE:
                sample = await timed(lambda p=policy: session.set_network_policy(p))
                if rep >= WARMUP:
                    switches[policy].append(sample)
            sample = timed_sync(lambda: raw_exec(ctx.raw, holder, ["true"]))
            if rep >= WARMUP:
                floor.append(sample)
    floor_s = summarize(floor)
    rows: list[Row] = []
    for policy, previous in zip(CYCLE, CYCLE[-1:] + CYCLE[:-1], strict=True):
        mine = summarize(switches[policy])
        rows.append(
            Row(
                f"set_network_policy {_mode(previous)} → {_mode(policy)}",
                mine,
                "one docker-py exec in the holder",
                floor_s,
                target=f"p50 ≤ {TARGET_S * 1000:.0f} ms",
                met=mine.median <= TARGET_S,
            )
        )
    return rows
