"""Docker under gVisor (`runtime="runsc"`, behind its gateway) beside runc: open → close
with `no-network` enforced, exec through the channel, and a switch (`runtimes`); the
switch keeps every switch's target. And what the gateway alone adds to an open (runc
behind one)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from bench.cases.docker_policy import TARGET_S
from bench.cases.runtimes import runtime_rows
from bench.context import Context
from bench.report import Row
from bench.stats import summarize
from corral.providers.docker import DockerEnvironment

RUNTIME = "runsc"


async def run(ctx: Context) -> list[Row]:
    engine = await ctx.env.engine()
    info: dict[str, Any] = await engine.call(engine.api.info)
    runtimes: dict[str, Any] = info.get("Runtimes") or {}
    if RUNTIME not in runtimes:
        reason = f"skipped: no Docker runtime {RUNTIME!r}; tests/integration/docker/engine.sh up"
        return [Row("docker under gVisor", note=reason)]
    gvisor = DockerEnvironment(ctx.env.config.model_copy(update={"runtime": RUNTIME}))
    try:
        rows = await runtime_rows(
            ctx,
            gvisor,
            ctx.env,
            ctx.plan("no-network"),
            where="docker",
            cases=(
                "open → close, no-network enforced",
                "exec `true` (channel)",
                "switch public → no-network (restore, probe refused)",
            ),
        )
    finally:
        await gvisor.aclose()
    switch = rows[-1]
    assert switch.corral is not None
    met = switch.corral.median <= TARGET_S
    rows[-1] = replace(switch, target=f"p50 ≤ {TARGET_S * 1000:.0f} ms", met=met)
    return [*rows, await _gateway_row(ctx)]


async def _gateway_row(ctx: Context) -> Row:
    """What the gateway alone costs an open: runc behind one beside runc without."""
    routed = DockerEnvironment(ctx.env.config.model_copy(update={"gateway": True}))
    envs = {"routed": routed, "shared": ctx.env}
    opens: dict[str, list[float]] = {name: [] for name in envs}
    try:
        for _ in range(ctx.reps(8)):
            for name, env in envs.items():
                started = time.perf_counter()
                session = await env.open(ctx.plan("no-network"))
                opens[name].append(time.perf_counter() - started)
                await env.close(session)
    finally:
        await routed.aclose()
    return Row(
        "docker behind a gateway (runc): open, no-network enforced",
        summarize(opens["routed"]),
        "runc in the holder's namespace",
        summarize(opens["shared"]),
    )
