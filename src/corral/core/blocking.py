"""Blocking SDK calls: in worker threads under a named limiter, never on the event loop,
retried only when the caller says the failure is transient and the call idempotent."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import anyio
from anyio.lowlevel import RunVar, checkpoint_if_cancelled
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

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


async def run_idempotent(
    transient: Callable[[BaseException], bool],
    key: str,
    tokens: int,
    fn: Callable[P, T],
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """`run_blocking`, retried with backoff while `transient(error)` holds."""
    async for attempt in AsyncRetrying(
        retry=retry_if_exception(transient),
        stop=stop_after_attempt(4),
        wait=wait_exponential(multiplier=0.2, max=2),
        reraise=True,
    ):
        with attempt:
            return await run_blocking(key, tokens, fn, *args, **kwargs)
    raise AssertionError("unreachable: tenacity reraises the last error")
