"""How a synchronous harness (mini-swe-agent calls `execute` from plain threads) reaches
a corral session, which lives on an event loop.

`OwnLoop` runs a loop of its own in a daemon thread for a session it opens; `CallerLoop`
calls into the loop of a session the caller opened, from a worker thread that loop started
(`anyio.to_thread.run_sync(agent.run, task)`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

import anyio.from_thread
from anyio.from_thread import BlockingPortal

T = TypeVar("T")


class Bridge(Protocol):
    def call(self, fn: Callable[[], Coroutine[Any, Any, T]]) -> T: ...


class OwnLoop:
    """An event loop in a daemon thread of its own, until a call to `last()` ends.

    A daemon thread, not anyio's portal (a non-daemon worker that Python joins before its
    exit hooks run): a harness that never closes the loop must not keep its process alive.
    """

    def __init__(self) -> None:
        self._portal: BlockingPortal | None = None
        self._last: Future[Any] | None = None
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="corral-minisweagent-loop", daemon=True
        )
        self._thread.start()
        ready.wait()
        if self._portal is None:
            raise RuntimeError("corral's event loop for mini-swe-agent did not start")

    def call(self, fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
        if self._portal is None or self._last is not None:
            raise RuntimeError("this environment was cleaned up: it can run nothing more")
        return self._portal.call(fn)

    def last(self, fn: Callable[[], Coroutine[Any, Any, Any]]) -> Future[Any]:
        """Run `fn` and then end the loop, without waiting: the future says when it is
        done. Idempotent: a second call returns the first call's future."""
        if self._last is None:
            portal = self._portal
            assert portal is not None
            self._last = portal.start_task_soon(self._then_stop, portal, fn)
        return self._last

    def _run(self, ready: threading.Event) -> None:
        try:
            anyio.run(self._serve, ready)
        finally:
            ready.set()

    async def _serve(self, ready: threading.Event) -> None:
        async with BlockingPortal() as portal:
            self._portal = portal
            ready.set()
            await portal.sleep_until_stopped()

    @staticmethod
    async def _then_stop(portal: BlockingPortal, fn: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
        try:
            return await fn()
        finally:
            await portal.stop()


class CallerLoop:
    """The loop that started the calling worker thread."""

    def call(self, fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
        return anyio.from_thread.run(fn)
