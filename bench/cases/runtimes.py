"""A provider under gVisor beside runc: open with `no-network` enforced, exec through the
channel, and a switch, each alternating between a sandbox under gVisor and one under the
default runtime (the ratio is gVisor's cost). Kubernetes: a Pod of the `gvisor`
RuntimeClass; Docker: `runtime="runsc"`, behind its gateway."""

from __future__ import annotations

import time

from bench.context import Context, timed
from bench.report import Row
from bench.stats import summarize
from corral import ExecutionPlan, NetworkPolicy
from corral.core.environment import BaseEnvironment
from corral.core.session import EnvironmentSession

RUNTIME_CLASS = "gvisor"


async def runtime_rows(
    ctx: Context,
    gvisor: BaseEnvironment,
    runc: BaseEnvironment,
    plan: ExecutionPlan,
    *,
    where: str,
    cases: tuple[str, str, str],
) -> list[Row]:
    """Rows `{where} under gVisor: {case}` for the open, the exec and the switch."""
    envs = {"gvisor": gvisor, "runc": runc}
    opens: dict[str, list[float]] = {name: [] for name in envs}
    for _ in range(ctx.reps(8)):
        for name, env in envs.items():
            started = time.perf_counter()
            session = await env.open(plan)
            opens[name].append(time.perf_counter() - started)
            await env.close(session)
    execs: dict[str, list[float]] = {name: [] for name in envs}
    switches: dict[str, list[float]] = {name: [] for name in envs}
    async with gvisor.session(plan) as on_gvisor, runc.session(plan) as on_runc:
        sessions: dict[str, EnvironmentSession] = {"gvisor": on_gvisor, "runc": on_runc}
        for session in sessions.values():
            await session.exec(["true"])  # starts the channel
        for _ in range(ctx.reps(20)):
            for name, session in sessions.items():
                execs[name].append(await timed(lambda s=session: s.exec(["true"])))
        for _ in range(ctx.reps(10)):
            for name, session in sessions.items():
                await session.set_network_policy(NetworkPolicy.public())
                switches[name].append(
                    await timed(lambda s=session: s.set_network_policy("no-network"))
                )
    return [
        Row(
            f"{where} under gVisor: {case}",
            summarize(samples["gvisor"]),
            "the same under runc",
            summarize(samples["runc"]),
        )
        for case, samples in zip(cases, (opens, execs, switches), strict=True)
    ]
