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
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, NamedTuple

import anyio
from docker.errors import APIError, NotFound

from corral.core.labels import OWNER, SESSION, is_session_id
from corral.core.logs import event
from corral.core.plan import ExecutionPlan
from corral.core.redact import plain_env
from corral.core.warmpool import Ready, SlotPool, release
from corral.providers.docker.engine import Engine
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


@dataclass(frozen=True)
class _Pair:
    session: DockerSession
    stack: AsyncExitStack


class WarmPool(SlotPool[_Pair]):
    """Idle holder+sandbox pairs per pool key (`core.warmpool`), taken by a rename."""

    def __init__(
        self, make: MakePair, plans: Sequence[ExecutionPlan], *, size: int, max_idle_s: float
    ) -> None:
        super().__init__({pool_key(plan): plan for plan in plans}, size=size, log=log)
        self.max_idle_s = max_idle_s
        self._make_pair = make

    async def take(self, plan: ExecutionPlan, owned: AsyncExitStack) -> DockerSession | None:
        """An idle pair for `plan`, now owned by `owned`; None when none matches."""
        pairs = self._idle.get(pool_key(plan)) if self._running() else None
        while pairs:
            ready = pairs.popleft()
            ready.taken.set()
            self._notify()
            if anyio.current_time() >= ready.stale_at:
                self._retire_soon(ready)
                continue
            owned.push_async_callback(ready.item.stack.aclose)
            session = ready.item.session
            try:
                await session.engine.call(
                    session.engine.api.rename,
                    pooled_holder_name(session.id),
                    holder_name(session.id),
                )
            except (NotFound, APIError) as exc:
                event(
                    log, "warning", "pooled sandbox unusable", sandbox=session.id, error=repr(exc)
                )
                await self._retire(ready)
                continue
            session.claimed_for(plan)
            self.hits += 1
            return session
        self.misses += 1
        return None

    async def _make(self, key: str, plan: ExecutionPlan) -> Ready[_Pair]:
        stack = AsyncExitStack()
        started = anyio.current_time()
        try:
            with anyio.fail_after(plan.timeouts.startup_s):
                session = await self._make_pair(plan, stack, Pooling(self.id, self.max_idle_s))
        except BaseException:
            await release(stack.aclose, log)
            raise
        return Ready(_Pair(session, stack), started + self.max_idle_s)

    async def _retire(self, ready: Ready[_Pair]) -> None:
        await release(ready.item.stack.aclose, log)


async def collect_idle(engine: Engine, owner: str, now: float) -> list[str]:
    """Remove `owner`'s pooled pairs still idle past their idle-until (for `corral gc`).

    The holder goes first and by its pooled name, so a pair claimed meanwhile (renamed)
    is a NotFound here and is left alone with everything it owns.
    """
    holders: list[dict[str, Any]] = await engine.idempotent(
        engine.api.containers,
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
            await engine.call(
                engine.api.remove_container, pooled_holder_name(sid), force=True, v=True
            )
        except NotFound:
            continue
        await remove_container(engine, sandbox_name(sid), sid)
        await remove_services(engine, labels)
        await remove_network(engine, network_name(sid), sid)
        await remove_volume(engine, programs_volume(sid), sid)
        removed.append(f"idle pooled sandbox {sid}")
    return removed
