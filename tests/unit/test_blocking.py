"""Worker-thread calls: limits per token count, and prompt cancellation of a polling call."""

from __future__ import annotations

import threading
import time

import anyio
import pytest

from corral.core.blocking import limiter, run_stoppable

pytestmark = pytest.mark.anyio


async def test_limiters_with_other_token_counts_are_distinct() -> None:
    assert limiter("unit", 2).total_tokens == 2
    assert limiter("unit", 5).total_tokens == 5
    assert limiter("unit", 2) is limiter("unit", 2)


async def test_a_cancelled_stoppable_call_returns_promptly_after_its_thread() -> None:
    returned = threading.Event()
    reached_after = False

    def poll(stop: threading.Event) -> str:
        try:
            deadline = time.monotonic() + 30
            while not stop.is_set() and time.monotonic() < deadline:
                time.sleep(0.01)
            return "stopped" if stop.is_set() else "ran out"
        finally:
            returned.set()

    started = time.monotonic()
    with anyio.move_on_after(0.2) as scope:
        await run_stoppable("unit", 1, poll)
        reached_after = True
    assert scope.cancelled_caught
    assert not reached_after, "the cancellation was swallowed"
    assert returned.is_set(), "the worker thread was abandoned, not awaited"
    assert time.monotonic() - started < 1.0


async def test_an_uncancelled_stoppable_call_returns_its_value() -> None:
    assert await run_stoppable("unit", 1, lambda stop: stop.is_set()) is False


async def test_a_stoppable_call_raises_its_own_error() -> None:
    def fail(stop: threading.Event) -> None:
        raise ValueError("from the thread")

    with pytest.raises(ValueError, match="from the thread"):
        await run_stoppable("unit", 1, fail)
