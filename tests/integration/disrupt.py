"""Breaking a sandbox from outside while one of its commands runs."""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio

from corral import EnvironmentSession
from corral.errors import CorralError


async def exec_while(
    session: EnvironmentSession, disrupt: Callable[[], object], *, after_s: float = 1.0
) -> tuple[str, float]:
    """Run `sleep 60` and call `disrupt` (blocking, in a thread) `after_s` into it.

    Returns what the exec did ("returned N" or "raised Type: message") and how long it
    took; a hang fails after 30 s.
    """
    outcome = "returned"
    started = time.monotonic()

    async def disrupt_soon() -> None:
        await anyio.sleep(after_s)
        await anyio.to_thread.run_sync(disrupt)

    async with anyio.create_task_group() as group:
        group.start_soon(disrupt_soon)
        with anyio.fail_after(30):
            try:
                result = await session.exec(["sleep", "60"])
                outcome = f"returned {result.returncode}"
            except CorralError as exc:
                outcome = f"raised {type(exc).__name__}: {exc}"
    return outcome, time.monotonic() - started
