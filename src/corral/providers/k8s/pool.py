"""A warm pool of Kubernetes sandboxes: Pods made ahead, Ready behind the workload's gate
under a verified `no-network` NetworkPolicy, each claimed by at most one session.

The shape is the Docker pool's (`providers/docker/pool.py`): `KubernetesEnvironment.
warm_pool(*plans)` runs a `WarmPool`, an async context manager that owns a task group with
`size` slots per pool key. A slot makes a Pod (its NetworkPolicy, `no-network`, first; then
the Pod; then the probe shows `no-network` enforced), marks it idle, waits until it is
claimed or has waited `max_idle_s`, then makes the next one. So a pool never holds more
than `size` Pods per key that are being made or idle, and refills in the background.
Leaving the block stops the slots and removes every idle Pod.

A claim is one conditional write on the API server: a merge patch of the Pod that turns
`corral.pool.state` from `idle` to `claimed` and carries the `resourceVersion` the claimer
last saw. The API server applies it only if nothing wrote the Pod since (else 409), so of
any number of claimers (tasks of one process, or harness processes of the same owner and
namespace) exactly one wins. Removing an idle Pod (a stale one, the drain, `corral gc`) is
a delete with the same precondition, after reading the Pod unclaimed: a Pod claimed
meanwhile is never removed, and a removed one is never handed out. The claim's patch also
sets the session's expiry, and shortens `activeDeadlineSeconds` to the Pod's age plus the
plan's lifetime (the API server lets it only decrease). Then the claimer patches the
NetworkPolicy to the plan's baseline, probes it, and opens the gate, as a cold open does
(`KubernetesEnvironment._start`): the workload never runs before its baseline applies.

The pool key is a digest of the Pod a cold open of the plan would create: the manifest
(`pod.manifest`), without the session's name, identity labels and operation timeout.
Whatever the plan or the config decides at creation (image, env, secret values hashed,
resources, workdir, command, services, labels, lifetime, runtime class, securityContext,
placement, probe image, DNS) is in it, so a plan that differs in any of it opens cold.
The baseline policy is not in it: one pool serves plans that differ only in policies.

A process running a pool for a key claims its own idle Pods first, then the oldest idle
one of that key the API server lists (another harness process's: the key guarantees the
same spec). Each pool refills only its own, and learns that one of them was claimed
elsewhere by listing its Pods every `POLL_S`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, NamedTuple

import anyio
from anyio.abc import TaskGroup
from kubernetes.client.exceptions import ApiException

from corral.core.labels import EXPIRES_AT, OWNER, SESSION, is_session_id
from corral.core.logs import event
from corral.core.plan import ExecutionPlan
from corral.core.warmpool import Ready, SlotPool, release
from corral.errors import ProviderError
from corral.network.targets import IPAddress
from corral.providers.k8s.api import call, explain, idempotent, status_of
from corral.providers.k8s.config import KubernetesConfig
from corral.providers.k8s.objects import Objects, annotations_of, labels_of
from corral.providers.k8s.pod import INSTANCE, OPERATION_TIMEOUT, fatal, manifest, running

log = logging.getLogger("corral.k8s.pool")

#: The id of the pool (one `warm_pool` block of one process) that made the Pod.
POOL = "corral.pool"
#: `pool_key` of the plan the Pod was made for.
POOL_KEY = "corral.pool.key"
#: `filling` (being made), `idle` (claimable) or `claimed` (a session's, for good).
STATE = "corral.pool.state"
#: Epoch seconds after which an unclaimed Pod is stale: its pool replaces it, gc removes it
#: (set when it is made, then again when it turns idle: `max_idle_s` from then).
IDLE_UNTIL = "corral.pool.idle-until"
#: A token of the claim that won, so a claimer whose answer was lost learns it won.
CLAIM = "corral.pool.claim"
FILLING, IDLE, CLAIMED = "filling", "idle", "claimed"

#: How often a pool lists its Pods to learn which were claimed by another process.
POLL_S = 1.0
#: A Pod this close to its idle age is left to its pool's replacement, not claimed.
CLAIM_MARGIN_S = 2.0
#: Conditional writes tried per Pod when something else (the kubelet) wrote it meanwhile.
TRIES = 4
#: Slack on a claimed Pod's deadline for the kubelet's clock against this host's.
DEADLINE_SLACK_S = 5
_MERGE = "application/merge-patch+json"
_KEY_NAME = "corral-pooled"


def pool_key(
    plan: ExecutionPlan, image: str, cfg: KubernetesConfig, dns: tuple[IPAddress, ...]
) -> str:
    """A digest (40 hex digits, a label value) of the Pod a cold open of the prepared
    `plan` would create, without what is the session's own (its name, identity labels)
    or set when the Pod is claimed (the operation timeout). Secret env values go into the
    digest only, never into anything kept or logged."""
    body = manifest(_KEY_NAME, image, plan, cfg, {**cfg.labels, **plan.labels}, dns)
    body["metadata"]["annotations"].pop(OPERATION_TIMEOUT, None)
    text = json.dumps(body, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def claim_patch(
    resource_version: str,
    token: str,
    *,
    expires_at: int,
    active_deadline_s: int,
    operation_s: float | None,
) -> dict[str, Any]:
    """The claim: a merge patch applied only to the Pod at `resource_version`."""
    timeout = None if operation_s is None else str(operation_s)
    return {
        "metadata": {
            "resourceVersion": resource_version,
            "labels": {STATE: CLAIMED, IDLE_UNTIL: None, EXPIRES_AT: str(expires_at)},
            "annotations": {CLAIM: token, OPERATION_TIMEOUT: timeout},
        },
        "spec": {"activeDeadlineSeconds": active_deadline_s},
    }


def claimed_deadline(
    started_at: float | None, now: float, lifetime_s: float, current: int | None
) -> int:
    """`activeDeadlineSeconds` of a Pod claimed at `now`: its age since the kubelet started
    it, plus the plan's lifetime and a little slack, never more than it has."""
    age = max(0.0, now - started_at) if started_at is not None else 0.0
    wanted = math.ceil(age + lifetime_s) + DEADLINE_SLACK_S
    return wanted if current is None else min(wanted, current)


def collectable(labels: Mapping[str, str], owner: str, now: float) -> bool:
    """Whether `corral gc` may remove a Pod with these labels: `owner`'s, pooled, not
    claimed, and past its idle age."""
    until = labels.get(IDLE_UNTIL, "")
    return (
        labels.get(OWNER) == owner
        and is_session_id(labels.get(SESSION, ""))
        and labels.get(STATE) in (FILLING, IDLE)
        and until.isdigit()
        and int(until) <= now
    )


def unclaimed(labels: Mapping[str, str]) -> bool:
    return labels.get(STATE) in (FILLING, IDLE)


def _started_at(pod: Any) -> float | None:
    started: Any = pod.status.start_time if pod.status else None
    return started.timestamp() if started is not None else None


class Pooling(NamedTuple):
    """What a pooled Pod is made with, beyond its plan."""

    pool_id: str
    key: str
    max_idle_s: float

    def labels(self, startup_s: float) -> dict[str, str]:
        """Labels of a Pod being made: it is stale if not idle within `startup_s`, then
        `max_idle_s` (marked idle, its idle age starts again)."""
        until = str(int(time.time() + startup_s + self.max_idle_s))
        return {POOL: self.pool_id, POOL_KEY: self.key, STATE: FILLING, IDLE_UNTIL: until}


@dataclass(eq=False)
class Pooled:
    """An idle Pod of this pool, as last seen."""

    name: str
    session_id: str
    instance: str | None
    resource_version: str
    started_at: float | None
    active_deadline_s: int | None
    #: this process's fill copied corral's helper into the Pod's programs volume
    helper_copied: bool = False

    def seen(self, pod: Any) -> None:
        """The Pod as listed again, still idle: a claim patches this version of it."""
        self.resource_version = pod.metadata.resource_version

    @classmethod
    def of(cls, pod: Any, *, helper_copied: bool = False) -> Pooled:
        return cls(
            name=pod.metadata.name,
            session_id=labels_of(pod)[SESSION],
            instance=annotations_of(pod).get(INSTANCE),
            resource_version=pod.metadata.resource_version,
            started_at=_started_at(pod),
            active_deadline_s=pod.spec.active_deadline_seconds,
            helper_copied=helper_copied,
        )


class Claimed(NamedTuple):
    """A pooled Pod claimed for good, and whether this process's fill put corral's helper
    in it (a Pod of another process's pool: not known, so copied again)."""

    pod: Any
    helper_copied: bool


class _Seen(NamedTuple):
    """What a claim needs of a Pod as last seen: its version, start and deadline."""

    version: str
    started_at: float | None
    active_deadline_s: int | None

    @classmethod
    def of(cls, pod: Any) -> _Seen:
        return cls(
            pod.metadata.resource_version, _started_at(pod), pod.spec.active_deadline_seconds
        )


#: Makes one pooled Pod for `plan`, pushing its undo onto the stack; returns it idle.
MakePod = Callable[[ExecutionPlan, AsyncExitStack, Pooling], Awaitable[Ready[Pooled]]]


@dataclass(frozen=True)
class ClaimTerms:
    """What a claim writes for the plan that claims: its lifetime and exec timeout."""

    lifetime_s: float
    operation_s: float | None


async def remove_unclaimed(
    objects: Objects,
    name: str,
    session_id: str,
    instance: str | None,
    removable: Callable[[Mapping[str, str]], bool] = unclaimed,
) -> bool:
    """Delete pooled Pod `name` (then its NetworkPolicy) only while it is unclaimed and
    `removable`, by a delete conditional on the version read; False when it was claimed
    (it is a session's then, and left alone) or never settled. A Pod already gone counts
    as removed, and its NetworkPolicy goes too."""
    for _ in range(TRIES):
        pod = await objects.read("pod", name)
        if pod is None:
            break
        labels = labels_of(pod)
        if labels.get(SESSION) != session_id or (
            instance is not None and annotations_of(pod).get(INSTANCE) != instance
        ):
            return False  # not the Pod this pool (or gc) means
        if not removable(labels):
            return False
        if pod.metadata.deletion_timestamp is not None:
            break
        meta: Any = pod.metadata
        body = {
            "preconditions": {"uid": meta.uid, "resourceVersion": meta.resource_version},
            "gracePeriodSeconds": 0,
        }
        try:
            await idempotent(
                objects.clients.tokens,
                objects.clients.core.delete_namespaced_pod,
                name,
                objects.namespace,
                body=body,
            )
        except ApiException as exc:
            if status_of(exc) == 404:
                break
            if status_of(exc) == 409:
                continue  # written meanwhile (claimed, or the kubelet): read again
            raise ProviderError(f"deleting pooled Pod {name}: {explain(exc)}") from None
        break
    else:
        return False
    await objects.delete("network_policy", name, session_id, instance)
    return True


class WarmPool(SlotPool[Pooled]):
    """Idle Pods per pool key (`core.warmpool`), claimed by a conditional write."""

    def __init__(
        self,
        make: MakePod,
        objects: Objects,
        plans: Mapping[str, ExecutionPlan],
        *,
        size: int,
        max_idle_s: float,
    ) -> None:
        super().__init__(plans, size=size, log=log)
        self.max_idle_s = max_idle_s
        #: claims another claimer won
        self.lost = 0
        self._make_pod = make
        self._objects = objects

    def _background(self, tg: TaskGroup) -> None:
        if self.size:
            tg.start_soon(self._watch, tg)

    async def claim(self, key: str, terms: ClaimTerms, owned: AsyncExitStack) -> Claimed | None:
        """A running pooled Pod of `key`, claimed for good, its removal pushed onto `owned`;
        None when there is none to claim (the open goes cold)."""
        if not self._running() or key not in self._plans:
            self.misses += 1
            return None
        idle = self._idle[key]
        tried: set[str] = set()
        for ready in list(idle):
            record = ready.item
            tried.add(record.name)
            if ready not in idle or ready.stale_at - anyio.current_time() < CLAIM_MARGIN_S:
                continue  # another task has it, or its slot replaces it in a moment
            idle.remove(ready)
            self._notify()
            seen = _Seen(record.resource_version, record.started_at, record.active_deadline_s)
            pod, kept = await self._claim_one(record.name, seen, terms, owned)
            if kept and self._running():
                idle.append(ready)  # still idle: only the claim's writes failed
            else:
                if kept:  # the pool is draining: its Pods go
                    await self._retire(ready)
                ready.taken.set()  # ours now, or another claimer's, or gone: refill
            if pod is not None:
                self.hits += 1
                return Claimed(pod, record.helper_copied)
        for found in await self._listed(key):
            if found.metadata.name in tried:
                continue
            pod, _ = await self._claim_one(found.metadata.name, _Seen.of(found), terms, owned)
            if pod is not None:
                self.hits += 1
                return Claimed(pod, helper_copied=False)
        self.misses += 1
        return None

    async def _listed(self, key: str) -> list[Any]:
        """Idle Pods of `key` of every pool of this owner, oldest first."""
        selector = f"{OWNER}={self._objects.owner},{POOL_KEY}={key},{STATE}={IDLE}"
        now = time.time()

        def claimable(pod: Any) -> bool:
            until = labels_of(pod).get(IDLE_UNTIL, "")
            fresh = until.isdigit() and int(until) - now >= CLAIM_MARGIN_S
            return fresh and _idle(pod)

        try:
            listed = await self._objects.listed("pod", selector)
        except (ProviderError, ApiException) as exc:  # the open goes cold, and says why
            event(log, "warning", "warm pool could not list idle Pods", error=str(exc))
            return []
        pods = [p for p in listed if claimable(p)]
        return sorted(pods, key=lambda p: (p.metadata.creation_timestamp, p.metadata.name))

    async def _claim_one(
        self, name: str, seen: _Seen, terms: ClaimTerms, owned: AsyncExitStack
    ) -> tuple[Any | None, bool]:
        """Claim Pod `name`, last seen idle as `seen`: the conditional patch, read again and
        retried while it stays idle (only someone else's write, the kubelet's, moved its
        version). Returns the claimed Pod (its removal on `owned`), or None and whether
        the Pod is still idle."""
        token = secrets.token_hex(8)
        for _ in range(TRIES):
            now = time.time()
            patch = claim_patch(
                seen.version,
                token,
                expires_at=int(now + terms.lifetime_s),
                active_deadline_s=claimed_deadline(
                    seen.started_at, now, terms.lifetime_s, seen.active_deadline_s
                ),
                operation_s=terms.operation_s,
            )
            pod = await self._write_claim(name, patch, token)
            if pod is not None:
                if fatal(pod) is not None or not running(pod):
                    cause = fatal(pod) or "not running"
                    event(log, "warning", "claimed pooled Pod unusable", pod=name, cause=cause)
                    await release(functools.partial(self._remove_claimed, pod), log)
                    return None, False
                self._own(pod, owned)
                return pod, False
            current = await self._objects.read("pod", name)
            if current is None or not _idle(current):
                self.lost += 1
                return None, False
            seen = _Seen.of(current)
        return None, True

    async def _write_claim(self, name: str, patch: dict[str, Any], token: str) -> Any | None:
        """The claim's one write, shielded so that its answer is never lost to a
        cancellation; an answer lost on the way is read back (the claim's token says
        whether it landed). None when it did not."""
        objects = self._objects
        with anyio.CancelScope(shield=True):
            try:
                return await call(
                    objects.clients.tokens,
                    objects.clients.core.patch_namespaced_pod,
                    name,
                    objects.namespace,
                    patch,
                    _content_type=_MERGE,
                )
            except ApiException as exc:
                if status_of(exc) == 422:
                    event(log, "warning", "claim refused", pod=name, error=explain(exc))
                if status_of(exc) in (404, 409, 422):
                    return None
                raise ProviderError(f"claiming Pod {name}: {explain(exc)}") from None
            except ProviderError:
                current = await objects.read("pod", name)
                if current is not None and annotations_of(current).get(CLAIM) == token:
                    return current
                return None

    def _own(self, pod: Any, owned: AsyncExitStack) -> None:
        """The claimed Pod is the open's now: removed by its undo, Pod first."""
        name: str = pod.metadata.name
        sid = labels_of(pod)[SESSION]
        instance = annotations_of(pod).get(INSTANCE)
        owned.push_async_callback(self._objects.delete, "network_policy", name, sid, instance)
        owned.push_async_callback(self._objects.delete, "pod", name, sid, instance)

    async def _remove_claimed(self, pod: Any) -> None:
        name: str = pod.metadata.name
        sid = labels_of(pod)[SESSION]
        instance = annotations_of(pod).get(INSTANCE)
        await self._objects.delete("pod", name, sid, instance)
        await self._objects.delete("network_policy", name, sid, instance)

    async def _make(self, key: str, plan: ExecutionPlan) -> Ready[Pooled]:
        stack = AsyncExitStack()
        try:
            with anyio.fail_after(plan.timeouts.startup_s):
                ready = await self._make_pod(plan, stack, Pooling(self.id, key, self.max_idle_s))
        except BaseException:
            await release(stack.aclose, log)
            raise
        stack.pop_all()  # idle now: removed only unclaimed (_retire), or by its claimer
        return ready

    async def _watch(self, tg: TaskGroup) -> None:
        """Every POLL_S, what the API server says of this pool's idle Pods: one claimed by
        another process, or gone, leaves the idle list (its slot refills); one that stopped
        running is removed first; the others' versions are kept current for the claims."""
        while True:
            await anyio.sleep(POLL_S)
            # Only what was idle before the list went out: one marked idle while it was on
            # its way may be listed as it was before.
            listed = {ready.item.name for idle in self._idle.values() for ready in idle}
            if not listed:
                continue
            try:
                pods = await self._objects.listed("pod", f"{POOL}={self.id}")
            except (ProviderError, ApiException) as exc:
                event(log, "warning", "warm pool could not list its Pods", error=str(exc))
                continue
            found = {p.metadata.name: p for p in pods}
            for idle in self._idle.values():
                for ready in list(idle):
                    if ready.item.name not in listed:
                        continue
                    pod = found.get(ready.item.name)
                    if pod is not None and _idle(pod) and running(pod):
                        ready.item.seen(pod)
                        continue
                    idle.remove(ready)
                    self._notify()
                    if pod is not None and _idle(pod):
                        tg.start_soon(self._replace, ready)
                    else:
                        ready.taken.set()

    async def _replace(self, ready: Ready[Pooled]) -> None:
        """An idle Pod that stopped running: removed, then its slot makes the next."""
        event(log, "warning", "pooled Pod stopped running; replacing it", pod=ready.item.name)
        await self._retire(ready)
        ready.taken.set()

    async def _retire(self, ready: Ready[Pooled]) -> None:
        """Remove an idle Pod unless someone claimed it meanwhile (shielded, bounded)."""
        objects, record = self._objects, ready.item

        async def remove() -> None:
            await remove_unclaimed(objects, record.name, record.session_id, record.instance)

        await release(remove, log)


def _idle(pod: Any) -> bool:
    return labels_of(pod).get(STATE) == IDLE and pod.metadata.deletion_timestamp is None


async def collect_idle(objects: Objects, now: float) -> list[str]:
    """Remove the owner's pooled Pods still unclaimed past their idle age (for `corral
    gc`): a dead harness's pool. Each by its exact name and session, only while it is
    still unclaimed (a conditional delete), so a Pod claimed meanwhile is left alone."""
    removed: list[str] = []
    for pod in await objects.listed("pod", f"{OWNER}={objects.owner},{POOL}"):
        labels = labels_of(pod)
        sid = labels.get(SESSION, "")
        name: str = pod.metadata.name
        if not collectable(labels, objects.owner, now) or name != f"corral-{sid}":
            continue
        instance = annotations_of(pod).get(INSTANCE)

        def removable(seen: Mapping[str, str]) -> bool:
            return collectable(seen, objects.owner, now)

        if await remove_unclaimed(objects, name, sid, instance, removable):
            removed.append(f"idle pooled Pod {name}")
    return removed
