"""Blocking SDK calls: in worker threads under a named limiter, never on the event loop,
retried only when the caller says the failure is transient and the call idempotent; and the
time bound of a shielded cleanup, which does not count the wait for a worker thread."""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Callable, Generator
from contextvars import ContextVar
from typing import ParamSpec, TypeVar

import anyio
from anyio.lowlevel import RunVar, checkpoint_if_cancelled

P = ParamSpec("P")
T = TypeVar("T")

_limiters: RunVar[dict[tuple[str, float], anyio.CapacityLimiter]] = RunVar("corral_limiters")


def limiter(key: str, tokens: float) -> anyio.CapacityLimiter:
    """The process-wide limiter of `tokens` named `key` (one per event loop), made on first
    use; callers that ask for other token counts (two configs' `max_workers`) get their own."""
    try:
        limiters = _limiters.get()
    except LookupError:
        limiters: dict[tuple[str, float], anyio.CapacityLimiter] = {}
        _limiters.set(limiters)
    if (key, tokens) not in limiters:
        limiters[key, tokens] = anyio.CapacityLimiter(tokens)
    return limiters[key, tokens]


class _CleanupBound:
    """A cleanup's time bound, stopped while any of its calls waits for a worker thread:
    when thousands of sessions close at once they queue for a few threads, and that wait is
    no sign that the backend is stuck (it was what made every close of 5,000 give up). The
    ceiling holds whatever the wait: a shielded cleanup must end."""

    def __init__(self, scope: anyio.CancelScope, seconds: float, ceiling_s: float) -> None:
        now = anyio.current_time()
        self.scope = scope
        self.ceiling = now + ceiling_s
        self.left = seconds
        self.queued = 0
        scope.deadline = min(now + seconds, self.ceiling)

    @contextlib.contextmanager
    def stopped(self) -> Generator[None]:
        if self.queued == 0:
            self.left = self.scope.deadline - anyio.current_time()
            self.scope.deadline = self.ceiling
        self.queued += 1
        try:
            yield
        finally:
            self.queued -= 1
            if self.queued == 0:
                self.scope.deadline = min(anyio.current_time() + self.left, self.ceiling)


_cleanup: ContextVar[_CleanupBound | None] = ContextVar("corral_cleanup_bound", default=None)


@contextlib.contextmanager
def cleanup_bound(seconds: float, ceiling_s: float) -> Generator[anyio.CancelScope]:
    """A scope shielded from the caller's cancellation, bounded to `seconds` of its own work
    and `ceiling_s` in all: the time its blocking calls spend queued for a worker thread
    (also in tasks it starts) counts only toward the ceiling."""
    with anyio.CancelScope(shield=True) as scope:
        token = _cleanup.set(_CleanupBound(scope, seconds, ceiling_s))
        try:
            yield scope
        finally:
            _cleanup.reset(token)


async def run_blocking(
    key: str, tokens: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
) -> T:
    bound = _cleanup.get()
    queue = limiter(key, tokens)
    with contextlib.nullcontext() if bound is None else bound.stopped():
        await queue.acquire()
    try:
        # The token taken above is the limit; the thread itself is not limited again.
        return await anyio.to_thread.run_sync(
            functools.partial(fn, *args, **kwargs), limiter=limiter("unlimited", math.inf)
        )
    finally:
        queue.release()


async def run_stoppable(key: str, tokens: int, fn: Callable[[threading.Event], T]) -> T:
    """`fn(stop)` in a worker thread, where `stop` is set as soon as the caller is
    cancelled; `fn` must poll it and return promptly. The thread is always waited for
    (never abandoned), and the cancellation is raised once it has returned."""
    stop = threading.Event()
    results: list[T] = []

    async def stop_when_cancelled() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            stop.set()

    failures: list[Exception] = []
    async with anyio.create_task_group() as group:
        group.start_soon(stop_when_cancelled)
        try:
            results.append(await run_blocking(key, tokens, fn, stop))
        except Exception as exc:  # raised as itself below, not in the group's ExceptionGroup
            failures.append(exc)
        finally:
            group.cancel_scope.cancel()
    # The thread's value must not hide the caller's cancellation.
    await checkpoint_if_cancelled()
    if failures:
        raise failures[0]
    return results[0]


# The pauses between the attempts of an idempotent call: four attempts in all.
_BACKOFF_S = (0.2, 0.4, 0.8)


async def run_idempotent(
    transient: Callable[[BaseException], bool],
    key: str,
    tokens: int,
    fn: Callable[P, T],
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """`run_blocking`, retried with backoff while `transient(error)` holds. A plain loop
    rather than a retry library's: at 5,000 sessions the library's per-call state (about 30
    objects in reference cycles per call) was the collector's work that stalled the loop."""
    for pause in (*_BACKOFF_S, None):
        try:
            return await run_blocking(key, tokens, fn, *args, **kwargs)
        except Exception as exc:
            if pause is None or not transient(exc):
                raise
        await anyio.sleep(pause)
    raise AssertionError("unreachable: the last attempt returns or raises")
