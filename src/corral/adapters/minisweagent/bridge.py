"""How a synchronous harness (mini-swe-agent calls `execute` from plain threads) reaches
a corral session, which lives on an event loop.

`OwnLoop` runs a loop of its own in a thread (anyio's blocking portal) for a session it
opens; `CallerLoop` calls into the loop of a session the caller opened, from a worker
thread that loop started (`anyio.to_thread.run_sync(agent.run, task)`).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

import anyio.from_thread
from anyio.from_thread import BlockingPortal

T = TypeVar("T")


class Bridge(Protocol):
    def call(self, fn: Callable[[], Coroutine[Any, Any, T]]) -> T: ...

    def close(self) -> None: ...


class OwnLoop:
    """An event loop in a thread of its own, until `close()`."""

    def __init__(self) -> None:
        self._manager: AbstractContextManager[BlockingPortal] = (
            anyio.from_thread.start_blocking_portal()
        )
        self._portal: BlockingPortal | None = self._manager.__enter__()

    def call(self, fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
        if self._portal is None:
            raise RuntimeError("this environment was cleaned up: it can run nothing more")
        return self._portal.call(fn)

    def close(self) -> None:
        if self._portal is not None:
            self._portal = None
            self._manager.__exit__(None, None, None)


class CallerLoop:
    """The loop that started the calling worker thread."""

    def call(self, fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
        return anyio.from_thread.run(fn)

    def close(self) -> None:
        return None
