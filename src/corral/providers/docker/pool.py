"""A warm pool of Docker sandboxes: holder+sandbox pairs made ahead under a plan's baseline.

A pair includes the plan's services, started and healthy; `corral gc` removes them with it.

`DockerEnvironment.warm_pool(*plans)` runs a `WarmPool`: an async context manager that owns
a task group with `size` slots per pool key. A slot makes a pair, waits until `open()`
takes it or it has waited `max_idle_s`, then makes the next one, so a taken pair is
refilled in the background and a stale one replaced. `open()` with a plan whose
`pool_key` matches takes an idle pair; any other plan opens cold. Leaving the block stops
the slots and removes every idle pair.

Claiming a pair renames its holder from `corral-<sid>-pooled` to `corral-<sid>-holder`;
the engine renames a container once, and `corral gc` removes idle pairs by their pooled
name only, so a claimed sandbox is never collected as idle and a collected one is never
handed out. Pooled resources carry `corral.pool` and `corral.pool.idle-until`, and their
`corral.expires-at` covers the idle wait plus the session's lifetime.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import time
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import anyio
from anyio.abc import TaskGroup
from docker.errors import APIError, NotFound

from corral.core.environment import CLEANUP_TIMEOUT_S
from corral.core.labels import OWNER, SESSION, is_session_id
from corral.core.logs import event
from corral.core.plan import ExecutionPlan
from corral.core.redact import plain_env
from corral.errors import ProviderError
from corral.providers.docker.engine import Engine, call, idempotent
from corral.providers.docker.resources import (
    holder_name,
    network_name,
    pooled_holder_name,
    programs_volume,
    remove_container,
    remove_network,
    remove_volume,
    sandbox_name,
)
from corral.providers.docker.services import remove_services
from corral.providers.docker.session import DockerSession

log = logging.getLogger("corral.docker.pool")

POOL = "corral.pool"
IDLE_UNTIL = "corral.pool.idle-until"
MAX_BACKOFF_S = 60.0


class Pooling(NamedTuple):
    """What a pooled pair is made with, beyond its plan."""

    pool_id: str
    max_idle_s: float

    def labels(self) -> dict[str, str]:
        return {POOL: self.pool_id, IDLE_UNTIL: str(int(time.time() + self.max_idle_s))}


#: Makes one pair for `plan`, pushing an undo onto the stack after each resource.
MakePair = Callable[[ExecutionPlan, AsyncExitStack, Pooling], Awaitable[DockerSession]]


def pool_key(plan: ExecutionPlan) -> str:
    """A digest of everything in a prepared plan that shapes the containers.

    Secret env values go into the digest only, never into anything kept or logged.
    Timeouts other than `max_lifetime_s` (which sets the expiry label), tags, benchmark,
    task id and the run/evaluation policies do not change what is created. Services do
    (each is a container of the pair, started and healthy before it waits): a plan takes
    only a sandbox made with exactly its services.
    """
    shape: dict[str, Any] = {
        "image": [plan.native, plan.image, plan.task_image, plan.fallback_image],
        "baseline": plan.network.baseline.model_dump(mode="json"),
        "env": plain_env(plan.env),
        "resources": plan.resources.model_dump(mode="json"),
        "workdir": plan.workdir,
        "command": plan.command,
        "labels": plan.labels,
        "max_lifetime_s": plan.timeouts.max_lifetime_s,
        "services": {
            name: {
                **spec.model_dump(mode="json", exclude={"env", "public_env_names"}),
                "env": plain_env(spec.env),
            }
            for name, spec in plan.services.items()
        },
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(eq=False)
class _Pair:
    session: DockerSession
    stack: AsyncExitStack
    started_at: float
    taken: anyio.Event = field(default_factory=anyio.Event)


class WarmPool:
    """Idle pairs per pool key, refilled by slot tasks this pool's `running()` owns."""

    def __init__(
        self, make: MakePair, plans: Sequence[ExecutionPlan], *, size: int, max_idle_s: float
    ) -> None:
        self.id = secrets.token_hex(4)
        self.size = size
        self.max_idle_s = max_idle_s
        self.hits = 0
        self.misses = 0
        self._make = make
        self._plans = {pool_key(plan): plan for plan in plans}
        self._idle: dict[str, deque[_Pair]] = {key: deque() for key in self._plans}
        self._changed = anyio.Event()
        self._failure: Exception | None = None
        self._tg: TaskGroup | None = None

    def __repr__(self) -> str:
        return (
            f"<WarmPool id={self.id} keys={len(self._plans)} size={self.size} idle={self.idle()}>"
        )

    def idle(self) -> int:
        """Pairs waiting to be taken, over every key."""
        return sum(len(pairs) for pairs in self._idle.values())

    @asynccontextmanager
    async def running(self) -> AsyncGenerator[WarmPool]:
        """Fill and refill in the background while the block runs; drain on the way out."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                for key, plan in self._plans.items():
                    for _ in range(self.size):
                        tg.start_soon(self._slot, key, plan)
                try:
                    yield self
                finally:
                    self._tg = None
                    tg.cancel_scope.cancel()
        finally:
            self._tg = None
            await self._drain()

    async def ready(self) -> None:
        """Wait until every key has `size` idle pairs; raise if making one failed."""
        while True:
            changed = self._changed
            if self._failure is not None:
                raise ProviderError(
                    f"warm pool {self.id} could not make a sandbox: {self._failure}"
                ) from self._failure
            if all(len(pairs) >= self.size for pairs in self._idle.values()):
                return
            await changed.wait()

    async def take(self, plan: ExecutionPlan, owned: AsyncExitStack) -> DockerSession | None:
        """An idle pair for `plan`, now owned by `owned`; None when none matches."""
        pairs = self._idle.get(pool_key(plan)) if self._tg is not None else None
        while pairs:
            pair = pairs.popleft()
            pair.taken.set()
            self._notify()
            if anyio.current_time() - pair.started_at >= self.max_idle_s:
                self._discard_soon(pair)
                continue
            owned.push_async_callback(pair.stack.aclose)
            session = pair.session
            try:
                await call(
                    session.tokens,
                    session.client.api.rename,
                    pooled_holder_name(session.id),
                    holder_name(session.id),
                )
            except (NotFound, APIError) as exc:
                event(
                    log, "warning", "pooled sandbox unusable", sandbox=session.id, error=repr(exc)
                )
                await _release(pair.stack)
                continue
            session.default_timeout = plan.timeouts.operation_s
            self.hits += 1
            return session
        self.misses += 1
        return None

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def _discard_soon(self, pair: _Pair) -> None:
        if self._tg is not None:
            self._tg.start_soon(_release, pair.stack)

    async def _slot(self, key: str, plan: ExecutionPlan) -> None:
        failures = 0
        while True:
            try:
                pair = await self._new_pair(plan)
            except Exception as exc:
                failures += 1
                self._failure = exc
                self._notify()
                event(log, "warning", "warm pool could not make a sandbox", error=repr(exc))
                await anyio.sleep(min(2.0**failures, MAX_BACKOFF_S))
                continue
            failures = 0
            self._failure = None
            pairs = self._idle[key]
            pairs.append(pair)
            self._notify()
            with anyio.move_on_after(pair.started_at + self.max_idle_s - anyio.current_time()):
                await pair.taken.wait()
            if not pair.taken.is_set():
                pairs.remove(pair)
                self._notify()
                await _release(pair.stack)

    async def _new_pair(self, plan: ExecutionPlan) -> _Pair:
        stack = AsyncExitStack()
        started = anyio.current_time()
        try:
            with anyio.fail_after(plan.timeouts.startup_s):
                session = await self._make(plan, stack, Pooling(self.id, self.max_idle_s))
        except BaseException:
            await _release(stack)
            raise
        return _Pair(session, stack, started)

    async def _drain(self) -> None:
        pairs = [pair for idle in self._idle.values() for pair in idle]
        for idle in self._idle.values():
            idle.clear()
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as tg:
                for pair in pairs:
                    tg.start_soon(_release, pair.stack)
        if pairs:
            event(log, "info", "warm pool drained", pool=self.id, sandboxes=len(pairs))


async def _release(stack: AsyncExitStack) -> None:
    with anyio.CancelScope(shield=True) as scope:
        scope.deadline = anyio.current_time() + CLEANUP_TIMEOUT_S
        try:
            await stack.aclose()
        except Exception as exc:
            event(log, "error", "warm pool cleanup failed", error=repr(exc))


async def collect_idle(client: Engine, tokens: int, owner: str, now: float) -> list[str]:
    """Remove `owner`'s pooled pairs still idle past their idle-until (for `corral gc`).

    The holder goes first and by its pooled name, so a pair claimed meanwhile (renamed)
    is a NotFound here and is left alone with everything it owns.
    """
    holders: list[dict[str, Any]] = await idempotent(
        tokens,
        client.api.containers,
        all=True,
        filters={"label": [f"{OWNER}={owner}", IDLE_UNTIL, "corral.role=holder"]},
    )
    removed: list[str] = []
    for item in holders:
        labels: dict[str, str] = item.get("Labels") or {}
        sid = labels.get(SESSION, "")
        until = labels.get(IDLE_UNTIL, "")
        if not is_session_id(sid) or not until.isdigit() or int(until) > now:
            continue
        try:
            await call(
                tokens, client.api.remove_container, pooled_holder_name(sid), force=True, v=True
            )
        except NotFound:
            continue
        await remove_container(client, tokens, sandbox_name(sid), sid)
        await remove_services(client, tokens, labels)
        await remove_network(client, tokens, network_name(sid), sid)
        await remove_volume(client, tokens, programs_volume(sid), sid)
        removed.append(f"idle pooled sandbox {sid}")
    return removed
