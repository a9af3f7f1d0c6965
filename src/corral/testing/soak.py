"""Soak: many Docker opens at once, some cancelled at a random moment, some with a random
Engine API call failed (`EngineFaultProxy`), and what they leave behind.

Each open is `open -> exec true -> close` through `env.session`; an open either
completes, is cancelled, or raises a `CorralError`; anything else is a failure. The run's
owner label must find nothing afterwards, and a ticker on the event loop reports its worst
lag (a blocking call on the loop shows as a late tick).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio

from corral.core.plan import ExecutionPlan
from corral.errors import CorralError
from corral.providers.docker import DockerEnvironment
from corral.testing.engine_faults import EngineFaultProxy
from corral.testing.leftovers import settled

#: Calls 2.. of an open are fair game; call 1 is the client's version check.
_FIRST_CALL, _LAST_CALL = 2, 31


@dataclass
class SoakReport:
    opens: int
    concurrency: int
    cancelled_asked: int = 0
    faults_injected: int = 0
    outcomes: Counter[str] = field(default_factory=Counter[str])
    leaks: list[str] = field(default_factory=list[str])
    worst_lag_s: float = 0.0
    wall_s: float = 0.0

    @property
    def failures(self) -> dict[str, int]:
        """Outcomes that are neither a completed open, a cancellation, nor a CorralError."""
        return {k: n for k, n in self.outcomes.items() if k.startswith("unexpected")}

    def table(self) -> str:
        causes = ", ".join(f"{k} {n}" for k, n in sorted(self.outcomes.items()))
        return "\n".join(
            [
                "| opens | concurrency | cancels asked | faults injected | outcomes | "
                "failures | leaks | worst loop lag | wall |",
                "|---:|---:|---:|---:|---|---:|---:|---:|---:|",
                f"| {self.opens} | {self.concurrency} | {self.cancelled_asked} | "
                f"{self.faults_injected} | {causes} | {sum(self.failures.values())} | "
                f"{len(self.leaks)} | {self.worst_lag_s * 1000:.0f} ms | {self.wall_s:.0f} s |",
            ]
        )


async def soak(
    make_env: Callable[[str | None], DockerEnvironment],
    plan: ExecutionPlan,
    leftovers: Callable[[], list[str]],
    *,
    opens: int,
    concurrency: int = 8,
    cancel_p: float = 0.3,
    fault_p: float = 0.3,
    seed: int = 0,
) -> SoakReport:
    """`opens` opens, `concurrency` at a time; `make_env(base_url)` gives an environment
    (on the engine itself for None) whose objects `leftovers()` lists."""
    rng = random.Random(seed)
    outcomes = Counter[str]()
    asked = {"cancelled": 0, "faults": 0}
    worst_lag = [0.0]
    slots = anyio.Semaphore(concurrency)

    async def one() -> None:
        cancel_after = rng.uniform(0.0, 2.5) if rng.random() < cancel_p else None
        fault = rng.random() < fault_p
        asked["cancelled"] += cancel_after is not None
        asked["faults"] += fault
        fault_at = rng.randint(_FIRST_CALL, _LAST_CALL)
        action = rng.choice(("error", "drop"))
        async with slots:
            if not fault:
                outcome = await _open_once(make_env(None), plan, cancel_after)
            else:
                proxy = EngineFaultProxy(fault_at=fault_at, action=action).start()
                try:
                    outcome = await _open_once(make_env(proxy.base_url), plan, cancel_after)
                finally:
                    with anyio.CancelScope(shield=True):
                        await anyio.to_thread.run_sync(proxy.close)
        outcomes[outcome] += 1

    started = time.monotonic()
    async with anyio.create_task_group() as outer:
        outer.start_soon(_ticker, worst_lag)
        async with anyio.create_task_group() as group:
            for _ in range(opens):
                group.start_soon(one)
        outer.cancel_scope.cancel()
    wall_s = time.monotonic() - started
    return SoakReport(
        opens=opens,
        concurrency=concurrency,
        cancelled_asked=asked["cancelled"],
        faults_injected=asked["faults"],
        outcomes=outcomes,
        leaks=await settled(leftovers, timeout=15),
        worst_lag_s=worst_lag[0],
        wall_s=wall_s,
    )


async def _open_once(
    env: DockerEnvironment, plan: ExecutionPlan, cancel_after: float | None
) -> str:
    with anyio.CancelScope() as scope:
        if cancel_after is not None:
            scope.deadline = anyio.current_time() + cancel_after
        try:
            async with env.session(plan) as session:
                await session.exec(["true"])
        except CorralError as exc:
            return type(exc).__name__
        except Exception as exc:  # the soak's finding: reported, never raised
            return f"unexpected {type(exc).__name__}"
    return "cancelled" if scope.cancelled_caught else "completed"


async def _ticker(worst: list[float]) -> None:
    """Keeps in `worst[0]` the event loop's worst lag past a 10 ms sleep."""
    tick = 0.01
    while True:
        due = anyio.current_time() + tick
        await anyio.sleep(tick)
        worst[0] = max(worst[0], anyio.current_time() - due)
