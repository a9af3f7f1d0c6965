"""What every provider's warm pool shares: slots that keep sandboxes ready per pool key.

A pool runs `size` slots per pool key in a task group that its `running()` block owns. A
slot makes one sandbox (`_make`), lists it idle, waits until an open takes it or it goes
stale, retires it if nobody took it (`_retire`), and makes the next: so a pool never
holds more than `size` per key being made or idle, and refills in the background. A slot
whose make fails backs off and says why in `ready()`. Leaving the block stops the slots
and retires every idle sandbox, shielded and bounded. What a sandbox is, how an open
takes it for good and how it is retired are the provider's
(`providers/docker/pool.py`, `providers/k8s/pool.py`).
"""

from __future__ import annotations

import abc
import logging
import secrets
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Generic, Self, TypeVar

import anyio
from anyio.abc import TaskGroup

from corral.core.blocking import cleanup_bound
from corral.core.environment import CLEANUP_CEILING_S, CLEANUP_TIMEOUT_S
from corral.core.logs import event
from corral.core.plan import ExecutionPlan
from corral.errors import ProviderError

T = TypeVar("T")
MAX_BACKOFF_S = 60.0


@dataclass(eq=False)
class Ready(Generic[T]):
    """A sandbox a slot made, until an open takes it (`taken`) or it goes stale."""

    item: T
    #: anyio time after which it is stale: its slot retires it and makes the next
    stale_at: float
    taken: anyio.Event = field(default_factory=anyio.Event)


class SlotPool(abc.ABC, Generic[T]):
    """Idle sandboxes per pool key, refilled by slot tasks this pool's `running()` owns."""

    #: opens served by a pooled sandbox, and opens that went cold
    hits: int
    misses: int

    def __init__(
        self, plans: Mapping[str, ExecutionPlan], *, size: int, log: logging.Logger
    ) -> None:
        self.id = secrets.token_hex(4)
        self.size = size
        self.hits = 0
        self.misses = 0
        self._plans = dict(plans)
        self._idle: dict[str, deque[Ready[T]]] = {key: deque() for key in self._plans}
        self._changed = anyio.Event()
        self._failure: Exception | None = None
        self._tg: TaskGroup | None = None
        self._log = log

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} id={self.id} keys={len(self._plans)} size={self.size} "
            f"idle={self.idle()}>"
        )

    def idle(self) -> int:
        """Sandboxes waiting to be taken, over every key."""
        return sum(len(ready) for ready in self._idle.values())

    @asynccontextmanager
    async def running(self) -> AsyncGenerator[Self]:
        """Fill and refill in the background while the block runs; drain on the way out."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                for key, plan in self._plans.items():
                    for _ in range(self.size):
                        tg.start_soon(self._slot, key, plan)
                self._background(tg)
                try:
                    yield self
                finally:
                    self._tg = None
                    tg.cancel_scope.cancel()
        finally:
            self._tg = None
            await self._drain()

    async def ready(self) -> None:
        """Wait until every key has `size` idle sandboxes; raise if making one failed."""
        while True:
            changed = self._changed
            if self._failure is not None:
                raise ProviderError(
                    f"warm pool {self.id} could not make a sandbox: {self._failure}"
                ) from self._failure
            if all(len(ready) >= self.size for ready in self._idle.values()):
                return
            await changed.wait()

    @abc.abstractmethod
    async def _make(self, key: str, plan: ExecutionPlan) -> Ready[T]:
        """One new sandbox for `plan` (within its startup timeout), ready to be taken."""

    @abc.abstractmethod
    async def _retire(self, ready: Ready[T]) -> None:
        """Remove a sandbox nobody took (shielded and bounded: see `release`)."""

    def _background(self, tg: TaskGroup) -> None:
        """Start what else the pool runs beside its slots, in its task group."""

    def _running(self) -> bool:
        """Whether the block runs (not draining): only then are sandboxes taken or kept."""
        return self._tg is not None

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def _retire_soon(self, ready: Ready[T]) -> None:
        if self._tg is not None:
            self._tg.start_soon(self._retire, ready)

    async def _slot(self, key: str, plan: ExecutionPlan) -> None:
        failures = 0
        while True:
            try:
                ready = await self._make(key, plan)
            except Exception as exc:
                failures += 1
                self._failure = exc
                self._notify()
                event(self._log, "warning", "warm pool could not make a sandbox", error=repr(exc))
                await anyio.sleep(min(2.0**failures, MAX_BACKOFF_S))
                continue
            failures = 0
            self._failure = None
            idle = self._idle[key]
            idle.append(ready)
            self._notify()
            with anyio.move_on_after(ready.stale_at - anyio.current_time()):
                await ready.taken.wait()
            if not ready.taken.is_set():
                if ready in idle:
                    idle.remove(ready)
                self._notify()
                await self._retire(ready)

    async def _drain(self) -> None:
        idle = [ready for queue in self._idle.values() for ready in queue]
        for queue in self._idle.values():
            queue.clear()
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for ready in idle:
                    tg.start_soon(self._retire, ready)
        if idle:
            event(self._log, "info", "warm pool drained", pool=self.id, sandboxes=len(idle))


async def release(undo: Callable[[], Awaitable[object]], log: logging.Logger) -> None:
    """Run a pool's `undo` shielded from cancellation and bounded; a failure is logged."""
    with cleanup_bound(CLEANUP_TIMEOUT_S, CLEANUP_CEILING_S):
        try:
            await undo()
        except Exception as exc:
            event(log, "error", "warm pool cleanup failed", error=repr(exc))
