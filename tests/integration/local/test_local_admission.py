"""`max_opens_per_s` on `local` across processes: 4 harness processes open 64 sessions at
once, and no window of one second holds more opens than the rate, timed where the
provider starts its work."""

from __future__ import annotations

import multiprocessing
import os
import time
from contextlib import AsyncExitStack
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import anyio

from corral import EnvironmentSession, ExecutionPlan
from corral.providers.local import LocalConfig, LocalEnvironment

RATE_PER_S = 16.0
PROCESSES = 4
EACH = 16


class _Timed(LocalEnvironment):
    began: list[float]

    async def _open(
        self, plan: ExecutionPlan, owned: AsyncExitStack, *, session_id: str | None
    ) -> EnvironmentSession:
        self.began.append(time.time())
        return await super()._open(plan, owned, session_id=session_id)


async def _burst() -> list[float]:
    env = _Timed(LocalConfig(max_opens_per_s=RATE_PER_S))
    env.began = []
    sessions: list[EnvironmentSession] = []

    async def one() -> None:
        sessions.append(await env.open(ExecutionPlan()))

    try:
        async with anyio.create_task_group() as tg:
            for _ in range(EACH):
                tg.start_soon(one)
    finally:
        for session in sessions:
            await env.close(session)
    return env.began


def _harness(runtime: str, ready: Queue[Any], go: Event) -> None:
    os.environ["XDG_RUNTIME_DIR"] = runtime
    ready.put(None)
    go.wait()
    ready.put(anyio.run(_burst))


def _most_in_one_second(times: list[float]) -> int:
    most, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= 1.0:
            first += 1
        most = max(most, last - first + 1)
    return most


def test_64_opens_from_4_processes_never_exceed_the_rate(tmp_path: Path) -> None:
    mp = multiprocessing.get_context("spawn")
    ready: Queue[Any] = mp.Queue()
    go = mp.Event()
    harnesses = [mp.Process(target=_harness, args=(str(tmp_path), ready, go)) for _ in range(4)]
    for harness in harnesses:
        harness.start()
    try:
        for _ in harnesses:
            ready.get(timeout=60)
        go.set()
        began = sorted(at for _ in harnesses for at in ready.get(timeout=120))
    finally:
        for harness in harnesses:
            harness.join(timeout=30)
            if harness.is_alive():
                harness.kill()
    assert len(began) == PROCESSES * EACH
    assert _most_in_one_second(began) <= RATE_PER_S, began
    # the rate was shared, not each process's own: 64 opens at 16/s take about 4 s
    assert began[-1] - began[0] >= 0.9 * (len(began) - 1) / RATE_PER_S
    assert all(h.exitcode == 0 for h in harnesses)
