"""Worker-thread calls: limits per token count, prompt cancellation of a polling call, and
retries of idempotent calls that leave no garbage for the collector."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator

import anyio
import pytest

from corral.core import blocking
from corral.core.blocking import limiter, run_idempotent, run_stoppable

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


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(blocking, "_BACKOFF_S", (0.0, 0.0, 0.0))


def _failing(errors: Iterator[Exception]) -> tuple[list[int], Callable[[], str]]:
    calls: list[int] = []

    def call() -> str:
        calls.append(1)
        error = next(errors, None)
        if error is not None:
            raise error
        return "done"

    return calls, call


@pytest.mark.usefixtures("no_backoff")
async def test_an_idempotent_call_is_retried_while_its_error_is_transient() -> None:
    calls, call = _failing(iter([TimeoutError("1"), TimeoutError("2")]))
    assert await run_idempotent(lambda e: isinstance(e, TimeoutError), "unit", 1, call) == "done"
    assert len(calls) == 3


@pytest.mark.usefixtures("no_backoff")
async def test_an_idempotent_call_gives_up_after_four_attempts_with_the_last_error() -> None:
    calls, call = _failing(iter([TimeoutError(str(n)) for n in range(1, 10)]))
    with pytest.raises(TimeoutError, match="^4$"):
        await run_idempotent(lambda e: True, "unit", 1, call)
    assert len(calls) == 4


@pytest.mark.usefixtures("no_backoff")
async def test_an_error_that_is_not_transient_is_raised_at_once() -> None:
    calls, call = _failing(iter([ValueError("bad request")]))
    with pytest.raises(ValueError, match="bad request"):
        await run_idempotent(lambda e: isinstance(e, TimeoutError), "unit", 1, call)
    assert len(calls) == 1


async def test_a_cancellation_in_the_backoff_is_not_swallowed() -> None:
    calls, call = _failing(iter([TimeoutError(str(n)) for n in range(10)]))
    reached_after = False
    with anyio.move_on_after(0.1) as scope:
        await run_idempotent(lambda e: True, "unit", 1, call)
        reached_after = True
    assert scope.cancelled_caught and not reached_after
    assert len(calls) == 1, "the cancelled backoff went on to another attempt"


async def test_idempotent_calls_leave_no_cyclic_garbage() -> None:
    """5,000 sessions make hundreds of thousands of these calls; each reference cycle they
    leave is the collector's work, and a full collection stops the event loop."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(200):
            await run_idempotent(lambda e: True, "unit", 2, time.monotonic)
        unreachable = gc.collect()
    finally:
        if was_enabled:
            gc.enable()
    assert unreachable < 200, f"{unreachable} objects in cycles after 200 calls"
