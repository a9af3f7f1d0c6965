"""Blocking SDK calls: in worker threads under a named limiter, never on the event loop,
retried only when the caller says the failure is transient and the call idempotent."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import anyio
from anyio.lowlevel import RunVar, checkpoint_if_cancelled

P = ParamSpec("P")
T = TypeVar("T")

_limiters: RunVar[dict[tuple[str, int], anyio.CapacityLimiter]] = RunVar("corral_limiters")


def limiter(key: str, tokens: int) -> anyio.CapacityLimiter:
    """The process-wide limiter of `tokens` named `key` (one per event loop), made on first
    use; callers that ask for other token counts (two configs' `max_workers`) get their own."""
    try:
        limiters = _limiters.get()
    except LookupError:
        limiters: dict[tuple[str, int], anyio.CapacityLimiter] = {}
        _limiters.set(limiters)
    if (key, tokens) not in limiters:
        limiters[key, tokens] = anyio.CapacityLimiter(tokens)
    return limiters[key, tokens]


async def run_blocking(
    key: str, tokens: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
) -> T:
    return await anyio.to_thread.run_sync(
        functools.partial(fn, *args, **kwargs), limiter=limiter(key, tokens)
    )


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
