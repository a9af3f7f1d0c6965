"""Kubernetes under gVisor beside runc: Pod open with `no-network` enforced, exec through
the channel, and a switch, each alternating between a Pod of the `gvisor` RuntimeClass and
one of the node's default runtime (the ratio is gVisor's cost)."""

from __future__ import annotations

import time

from bench.context import Context, timed
from bench.report import Row
from bench.stats import summarize
from corral import ExecutionPlan, NetworkPolicy
from corral.core.session import EnvironmentSession
from corral.providers.k8s import KubernetesEnvironment

RUNTIME_CLASS = "gvisor"


async def runtime_rows(
    ctx: Context, gvisor: KubernetesEnvironment, runc: KubernetesEnvironment, plan: ExecutionPlan
) -> list[Row]:
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
            f"k8s under gVisor: {case}",
            summarize(samples["gvisor"]),
            "the same under runc",
            summarize(samples["runc"]),
        )
        for case, samples in (
            ("Pod open, no-network enforced", opens),
            ("exec `true` (channel)", execs),
            ("switch public → no-network (patch, probe refused)", switches),
        )
    ]
