"""The `k8s` provider.

Per session: a NetworkPolicy selecting the Pod by a label unique to the session, created
before the Pod; then the Pod (the sandbox container and corral's `corral-probe`), whose
workload waits behind a gate until corral has applied and probed the baseline. The
NetworkPolicy carries an ownerReference to the Pod, so the cluster's garbage collector
removes it if corral dies.

The plan's services are further containers of the same Pod (see `pod.py`): they share its
network namespace, so they and the sandbox reach each other on localhost, and its
NetworkPolicy, so the baseline, every switch and the probe (dialled from the shared
namespace) cover them all. `open` returns once the baseline is verified and every
service passed its healthcheck (exec'd in its container), and only then opens the
workload's gate. `end_workload()` ends the sandbox container's processes and leaves the
services running; `save()` holds the sandbox container's paths; an attached session
learns its services from the annotation its open wrote (`pod.SERVICES`).

`warm_pool(*plans)` keeps Pods made ahead (`pool.py`): each waits behind its gate under a
verified `no-network` NetworkPolicy, and `open()` of a plan of the same pool key claims one
with a conditional write, then takes it to the plan's baseline by the same steps a cold
open ends with (`_start`: baseline applied and probed, services healthy, gate opened).
"""

from __future__ import annotations

import contextlib
import ipaddress
import math
import secrets
import time
from collections.abc import AsyncGenerator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar

import anyio
from kubernetes.client.exceptions import ApiException

from corral.core.admission import Admission
from corral.core.blocking import limiter
from corral.core.environment import BaseEnvironment
from corral.core.labels import OWNER, SESSION, is_expired, new_session_id, session_labels
from corral.core.plan import ExecutionPlan
from corral.core.services import wait_healthy
from corral.core.session import EnvironmentSession
from corral.core.snapshot import SnapshotRef
from corral.core.snapshot_store import SnapshotShelf, default_root
from corral.core.warmpool import Ready
from corral.errors import ConfigError, NetworkPolicyNotEnforced, ProviderError, SessionIdTaken
from corral.helper import WithHelper
from corral.network.policy import NetworkMode, NetworkPolicy
from corral.network.resolve import Resolution, hostnames
from corral.network.targets import EntryType, IPAddress
from corral.providers.k8s import enforcement, probe
from corral.providers.k8s.api import Api, call, connect, explain, idempotent, status_of
from corral.providers.k8s.channel import ChannelExecutor
from corral.providers.k8s.config import KubernetesConfig
from corral.providers.k8s.execution import Target, run_own
from corral.providers.k8s.objects import Kind, Made, Objects, annotations_of, labels_of
from corral.providers.k8s.pod import (
    BUSYBOX,
    CONTAINER,
    INSTANCE,
    OPENED,
    READY_FILE,
    check_services,
    corral_sh,
    dns_servers,
    manifest,
    opened,
    operation_timeout,
    services,
    wait_running,
)
from corral.providers.k8s.pool import (
    IDLE,
    IDLE_UNTIL,
    STATE,
    ClaimTerms,
    Pooled,
    Pooling,
    WarmPool,
    collect_idle,
    pool_key,
    remove_unclaimed,
)
from corral.providers.k8s.reaper import Reaper
from corral.providers.k8s.session import KubernetesSession, Place


class KubernetesEnvironment(BaseEnvironment):
    id: ClassVar[str] = "k8s"
    config_model = KubernetesConfig
    supported_network_modes = frozenset(NetworkMode)
    supported_allowlist_entry_types = frozenset(EntryType) - {EntryType.WILDCARD_HOSTNAME}
    supports_network_target_ports = True
    supports_dynamic_network_policy = True
    supports_reattach = True
    supports_snapshot = True
    supports_services = True
    supports_processes = WithHelper(True, False)  # type: ignore[assignment]
    supports_pty = WithHelper(True, False)  # type: ignore[assignment]
    max_concurrent_opens = 16

    config: KubernetesConfig

    def __init__(self, config: KubernetesConfig | None = None, **params: Any) -> None:
        super().__init__(config, **params)
        self._clients: Api | None = None
        self._dns_servers: tuple[IPAddress, ...] | None = None
        self._pool: WarmPool | None = None
        cfg = self.config
        self.snapshots = SnapshotShelf(
            Path(cfg.snapshot_dir).expanduser() if cfg.snapshot_dir else default_root(self.id),
            provider=self.id,
            owner=cfg.owner,
            lifetime_s=cfg.snapshot_lifetime_s,
        )

    async def clients(self) -> Api:
        if self._clients is None:
            # Loading a kubeconfig reads files (and may run an exec credential plugin).
            clients = await anyio.to_thread.run_sync(connect, self.config)
            await self._check_namespace(clients)
            self._clients = clients
        return self._clients

    def _release(self) -> None:
        clients, self._clients = self._clients, None
        if clients is not None:
            clients.core.api_client.close()

    async def _resolvers(self) -> tuple[IPAddress, ...]:
        """The sandbox's resolvers, chosen here and never read from inside a Pod."""
        if self._dns_servers is None:
            if self.config.dns_servers is not None:
                found = self.config.dns_servers
            else:
                found = await _cluster_dns(await self.clients())
            self._dns_servers = tuple(ipaddress.ip_address(s) for s in found)
        return self._dns_servers

    async def _check_namespace(self, clients: Api) -> None:
        namespace = self.config.namespace
        try:
            await idempotent(
                clients.tokens, clients.core.read_namespace, namespace, _request_timeout=(3, 10)
            )
        except ApiException as exc:
            if status_of(exc) == 404 and self.config.create_namespace:
                body = {"metadata": {"name": namespace, "labels": {OWNER: self.config.owner}}}
                with contextlib.suppress(ApiException):
                    await call(clients.tokens, clients.core.create_namespace, body)
                return
            if status_of(exc) == 404:
                raise ConfigError(
                    f"namespace {namespace!r} does not exist (set create_namespace=True to let "
                    "corral create it)"
                ) from None
            if status_of(exc) == 403:
                raise ProviderError(f"forbidden by RBAC: {explain(exc)}") from None
            raise ProviderError(f"the API server refused: {explain(exc)}") from None
        except ProviderError as exc:
            raise ProviderError(
                f"the Kubernetes API server at {clients.host} does not answer: {exc}"
            ) from None

    @asynccontextmanager
    async def warm_pool(
        self,
        *plans: ExecutionPlan,
        size_per_key: int | None = None,
        max_idle_s: float | None = None,
    ) -> AsyncGenerator[WarmPool]:
        """Keep Pods for `plans` made ahead while the block runs; remove the idle ones after.

        Each pooled Pod waits Ready, its workload's gate closed, under a verified
        `no-network` NetworkPolicy. Inside the block, `open()` with a plan of the same pool
        key (the Pod a cold open of it would create; not its policies) claims one, patches
        its NetworkPolicy to the plan's baseline and probes it as a cold open does; the
        pool refills in the background; other plans open cold. Idle Pods of the same key
        that another harness process's pool made (same owner and namespace) are claimed
        too: `size_per_key=0` makes none and only claims those. Defaults:
        `warm_pool_size` per key, `warm_pool_max_idle_s`. One pool at a time.
        """
        if self._pool is not None:
            raise ConfigError(
                f"{self!r} already runs warm pool {self._pool.id}; give one pool every plan"
            )
        cfg = self.config
        size = cfg.warm_pool_size if size_per_key is None else size_per_key
        if size < 0:
            raise ConfigError(f"size_per_key must be 0 or more, not {size}")
        dns = await self._resolvers()
        keyed: dict[str, ExecutionPlan] = {}
        for plan in plans:
            prepared = self.prepare(plan)
            image = prepared.require_image(self.id)
            if not isinstance(image, str):
                raise ConfigError(f"native selector {image!r} is not supported by k8s")
            check_services(prepared)
            keyed[pool_key(prepared, image, cfg, dns)] = prepared
        pool = WarmPool(
            self._make_pooled,
            await self.objects(),
            keyed,
            size=size,
            max_idle_s=max_idle_s or cfg.warm_pool_max_idle_s,
        )
        self._pool = pool
        try:
            async with pool.running():
                yield pool
        finally:
            self._pool = None

    async def objects(self) -> Objects:
        """This owner's Pods and NetworkPolicies in the configured namespace."""
        return Objects(await self.clients(), self.config.namespace, self.config.owner)

    async def _open(
        self, plan: ExecutionPlan, owned: AsyncExitStack, *, session_id: str | None
    ) -> EnvironmentSession:
        # A pooled Pod already has its own id, so a chosen id is always made anew.
        if self._pool is not None and session_id is None:
            session = await self._claim(self._pool, plan, owned)
            if session is not None:
                return session
        session = await self._make_pod(plan, owned, session_id=session_id, pooling=None)
        # Unwound first: the exec channel's websocket and reader thread end with the session.
        owned.push_async_callback(session.executor.aclose)
        owned.push_async_callback(session.procs.aclose)
        await self._start(session, plan)
        return session

    async def _make_pod(
        self,
        plan: ExecutionPlan,
        owned: AsyncExitStack,
        *,
        session_id: str | None,
        pooling: Pooling | None,
    ) -> KubernetesSession:
        """The NetworkPolicy, then the Pod, running behind the workload's gate: what a cold
        open and a pool's fill both make. A pooled Pod starts under `no-network` whatever
        the plan's baseline, lives `max_idle_s` longer, and its undo spares it once claimed."""
        cfg = self.config
        clients = await self.clients()
        objects = await self.objects()
        dns = await self._resolvers()
        image = plan.require_image(self.id)
        if not isinstance(image, str):
            raise ConfigError(f"native selector {image!r} is not supported by k8s; give an image")
        check_services(plan)
        sid = session_id or new_session_id()
        name = f"corral-{sid}"
        if session_id is not None and await objects.read("pod", name) is not None:
            # A NetworkPolicy of ours would select that Pod too, and widen what it may reach.
            raise SessionIdTaken(f"Pod {name} already exists: session_id {sid!r} is taken")
        lifetime = plan.timeouts.max_lifetime_s or cfg.default_lifetime_s
        extra = {**cfg.labels, **plan.labels}
        # A pooled Pod lives on for its making (at most startup_s) and its idle wait; a
        # claim shortens that to the Pod's age plus the plan's lifetime.
        idle_s = 0.0
        if pooling is not None:
            idle_s = plan.timeouts.startup_s + pooling.max_idle_s
            extra |= pooling.labels(plan.timeouts.startup_s)
        labels = session_labels(cfg.owner, sid, lifetime + idle_s, extra)
        instance = secrets.token_hex(8)
        baseline = plan.network.baseline
        # Until the Pod runs, hostnames cannot be resolved as it resolves them: such a
        # baseline starts as no-network and is patched in before the workload's gate opens.
        unresolved = pooling is not None or hostnames(baseline)
        initial = NetworkPolicy.no_network() if unresolved else baseline
        body = enforcement.render(initial, Resolution(), name, sid, labels)
        made: Made = {}
        if pooling is not None:
            owned.push_async_callback(remove_unclaimed, objects, name, sid, instance)
        else:
            owned.push_async_callback(objects.delete, "network_policy", name, sid, instance, made)
        created_policy = await objects.create("network_policy", body, instance, session_id, made)
        if pooling is None:
            owned.push_async_callback(objects.delete, "pod", name, sid, instance, made)
        body = manifest(name, image, plan, cfg, labels, dns)
        body["spec"]["activeDeadlineSeconds"] += math.ceil(idle_s)
        pod = await objects.create("pod", body, instance, session_id, made)
        # Fails (the open with it, before the gate opens) if `gc` took the policy for an
        # orphan meanwhile: the Pod never runs the workload unpoliced.
        await objects.own(name, pod.metadata.uid, created_policy.metadata.name)
        pod = await wait_running(clients, cfg.namespace, name)
        return self._session(clients, pod, initial)

    async def _start(self, session: KubernetesSession, plan: ExecutionPlan) -> None:
        """A running Pod of the session's own to a working sandbox: the baseline applied and
        verified, the services healthy, then the workload's gate opened (a cold open, and
        a claim of a pooled Pod, alike)."""
        await self._apply_baseline(session, plan.network.baseline)
        # Under the verified baseline, and before the workload's own command starts (as
        # compose starts what depends on a healthy service); bounded by startup_s.
        await wait_healthy(session, plan.services)
        await self._open_gate(session)
        objects = await self.objects()
        await objects.patch_pod(session.target.pod, {"annotations": {OPENED: "true"}})

    async def _make_pooled(
        self, plan: ExecutionPlan, owned: AsyncExitStack, pooling: Pooling
    ) -> Ready[Pooled]:
        """One Pod for a warm pool: made as a cold open makes it, `no-network` verified by
        the probe, then marked idle (claimable); its workload's gate stays closed."""
        async with limiter(f"open:{self.id}", self.max_concurrent_opens):
            await Admission(self.id, self.config).admit()
            session = await self._make_pod(plan, owned, session_id=None, pooling=pooling)
            await self._apply_baseline(session, NetworkPolicy.no_network())
            until = str(int(time.time() + pooling.max_idle_s))
            objects = await self.objects()
            idle = {"labels": {STATE: IDLE, IDLE_UNTIL: until}}
            pod = await objects.patch_pod(session.target.pod, idle)
        # The probe's dial copied the helper (the gate still closed): a claim need not again.
        copied = isinstance(session.executor, ChannelExecutor) and session.executor.copied
        pooled = Pooled.of(pod, helper_copied=copied)
        return Ready(pooled, anyio.current_time() + pooling.max_idle_s)

    async def _claim(
        self, pool: WarmPool, plan: ExecutionPlan, owned: AsyncExitStack
    ) -> KubernetesSession | None:
        """A pooled Pod for `plan`, claimed and started under its baseline; None when the
        pool has none for its key."""
        image = plan.require_image(self.id)
        if not isinstance(image, str):
            return None  # the cold open says why
        key = pool_key(plan, image, self.config, await self._resolvers())
        lifetime = plan.timeouts.max_lifetime_s or self.config.default_lifetime_s
        terms = ClaimTerms(lifetime_s=lifetime, operation_s=plan.timeouts.operation_s)
        claimed = await pool.claim(key, terms, owned)
        if claimed is None:
            return None
        session = self._session(
            await self.clients(), claimed.pod, NetworkPolicy.no_network(), claimed.helper_copied
        )
        owned.push_async_callback(session.executor.aclose)
        owned.push_async_callback(session.procs.aclose)
        await self._start(session, plan)
        return session

    def _session(
        self, clients: Api, pod: Any, policy: NetworkPolicy, helper_copied: bool = False
    ) -> KubernetesSession:
        """The session of a running sandbox Pod, built from what the API server says of it:
        one builder for open and attach, so an attached session is the one open made."""
        cfg = self.config
        name: str = pod.metadata.name
        labels: dict[str, str] = dict(pod.metadata.labels or {})
        sandbox: Any = next(c for c in pod.spec.containers if c.name == CONTAINER)
        target = Target(clients, cfg.namespace, name, CONTAINER, (BUSYBOX, "sh"))
        places = {
            service: Place(target.sibling(container.name), container.working_dir or "/")
            for service, container in services(pod).items()
        }
        session = KubernetesSession(
            id=labels[SESSION],
            policy=policy,
            target=target,
            prober=target.sibling(probe.CONTAINER),
            service_places=places,
            policy_name=name,
            labels=labels,
            dns=dns_servers(pod),
            host_aliases=cfg.host_aliases,
            probe_candidates=[(node, cfg.probe_port) for node in _node_addresses(pod)],
            verify=cfg.verify_policy == "probe",
            verify_timeout_s=cfg.verify_timeout_s,
            workdir=sandbox.working_dir or "/",
            output_limit=cfg.output_limit_bytes,
            default_timeout=operation_timeout(pod),
            reaper=Reaper(
                target, cfg.probe_image, cfg.image_pull_policy, cfg.end_workload_timeout_s
            ),
            snapshots=self.snapshots,
            snapshot_paths=cfg.snapshot_paths,
            snapshot_limits=cfg.snapshot_limits,
            exec_channel=cfg.exec_channel,
            helper_copied=helper_copied,
            image=sandbox.image,
            run_as=run_as_of(pod, sandbox),
        )
        return session

    async def _apply_baseline(self, session: KubernetesSession, baseline: NetworkPolicy) -> None:
        """From the policy the Pod was created under to the baseline, verified."""
        try:
            if hostnames(baseline):
                dns = [str(s) for s in session.dns]
                dns_only = NetworkPolicy.allowlist(*dns) if dns else session.policy
                await session.enforce(dns_only)
            if session.policy != baseline or self.config.verify_policy == "probe":
                await session.enforce(baseline)
        except NetworkPolicyNotEnforced as exc:
            raise NetworkPolicyNotEnforced(
                f"sandbox {session.id}: {exc}; nothing was kept"
            ) from None

    async def _open_gate(self, session: KubernetesSession) -> None:
        gate = await run_own(session.target, corral_sh(f"touch {READY_FILE}"), output_limit=4096)
        if gate.returncode != 0:
            raise ProviderError(
                f"could not open the workload gate in Pod {session.target.pod}: {gate.stderr}"
            )

    async def _reattach(self, session_id: str) -> tuple[EnvironmentSession, AsyncExitStack] | None:
        name = f"corral-{session_id}"
        objects = await self.objects()
        pod = await objects.read("pod", name, session_id)
        if pod is None or not opened(pod):
            return None
        instance = annotations_of(pod).get(INSTANCE)
        found = await objects.read("network_policy", name, session_id)
        if found is None or annotations_of(found).get(INSTANCE) != instance:
            raise ProviderError(
                f"Pod {name} runs without the NetworkPolicy its open created, so the policy "
                "in force is unknown; close the session (or run corral gc) rather than attach"
            )
        session = self._session(await self.clients(), pod, enforcement.policy_in_force(found))
        if hostnames(session.policy):
            # Addresses move: resolve the policy's names again as open does, and re-apply.
            await session.enforce(session.policy)
        owned = AsyncExitStack()
        owned.push_async_callback(objects.delete, "network_policy", name, session_id, instance)
        owned.push_async_callback(objects.delete, "pod", name, session_id, instance)
        owned.push_async_callback(session.executor.aclose)
        owned.push_async_callback(session.procs.aclose)
        return session, owned

    async def _from_snapshot(self, ref: SnapshotRef, plan: ExecutionPlan) -> ExecutionPlan:
        # Refuse a missing or expired snapshot before anything is created.
        await anyio.to_thread.run_sync(self.snapshots.load, ref)
        return plan

    async def _restore(self, session: EnvironmentSession, ref: SnapshotRef) -> None:
        assert isinstance(session, KubernetesSession)
        record = await anyio.to_thread.run_sync(self.snapshots.load, ref)
        for index, path in enumerate(record.paths):
            await session.upload_dir(self.snapshots.tree(record.id, index), path)

    async def _discard_snapshot(self, ref: SnapshotRef) -> None:
        await anyio.to_thread.run_sync(self.snapshots.remove, ref)

    async def gc(self) -> list[str]:
        """Remove pooled Pods left unclaimed past their idle age (a dead harness's pool),
        then expired Pods and NetworkPolicies, then NetworkPolicies an open never gave
        their Pod (`orphans`), then expired snapshots."""
        objects = await self.objects()
        owner = self.config.owner
        now = time.time()
        removed = await collect_idle(objects, now)
        kinds: tuple[Kind, ...] = ("pod", "network_policy")
        for kind in kinds:
            for item in await objects.listed(kind, f"{OWNER}={owner}"):
                labels = labels_of(item)
                if is_expired(labels, owner, now):
                    instance = annotations_of(item).get(INSTANCE)
                    await objects.delete(kind, item.metadata.name, labels[SESSION], instance)
                    removed.append(f"{kind.replace('_', '')} {item.metadata.name}")
        removed += await orphans(objects, now)
        removed += await anyio.to_thread.run_sync(self.snapshots.collect)
        return removed


#: seconds a NetworkPolicy may go without its Pod before gc takes it for an orphan: an
#: open creates the Pod one API call after it
ORPHAN_GRACE_S = 60.0


async def orphans(objects: Objects, now: float) -> list[str]:
    """NetworkPolicies whose open died between creating them and making its Pod their
    owner (`Objects.own`): each is given to its Pod (the open's own, by its token), so it
    goes with it; removed when no Pod of its session exists ORPHAN_GRACE_S after it (one
    that does, whoever made it, is never left unpoliced)."""
    removed: list[str] = []
    for policy in await objects.listed("network_policy", f"{OWNER}={objects.owner}"):
        meta: Any = policy.metadata
        labels = labels_of(policy)
        if meta.owner_references or is_expired(labels, objects.owner, now):
            continue
        session_id, instance = labels[SESSION], annotations_of(policy).get(INSTANCE)
        pod = await objects.read("pod", meta.name, session_id)
        if pod is not None and annotations_of(pod).get(INSTANCE) == instance:
            with contextlib.suppress(ProviderError):  # gone meanwhile: the next gc sees to it
                await objects.own(meta.name, pod.metadata.uid, meta.name)
        elif pod is None and now - meta.creation_timestamp.timestamp() >= ORPHAN_GRACE_S:
            await objects.delete("network_policy", meta.name, session_id, instance)
            removed.append(f"networkpolicy {meta.name}")
    return removed


def _node_addresses(pod: Any) -> list[IPAddress]:
    """The node's addresses, its primary first (an IPv6 one only on a dual-stack node)."""
    listed: list[Any] = pod.status.host_ips or []
    found = [ipaddress.ip_address(pod.status.host_ip)]
    found += [a for a in (ipaddress.ip_address(h.ip) for h in listed) if a not in found]
    return found


def run_as_of(pod: Any, container: Any) -> int | None:
    """The uid the Pod spec says its sandbox container runs as (the container's own
    securityContext first, then the Pod's), as the API server keeps it."""
    for context in (container.security_context, pod.spec.security_context):
        uid: int | None = getattr(context, "run_as_user", None)
        if uid is not None:
            return uid
    return None


async def _cluster_dns(clients: Api) -> tuple[str, ...]:
    """The ClusterIP of kube-system/kube-dns, or none when the cluster has no such Service."""
    try:
        service: Any = await idempotent(
            clients.tokens, clients.core.read_namespaced_service, "kube-dns", "kube-system"
        )
    except ApiException as exc:
        if status_of(exc) == 404:
            return ()
        raise ProviderError(
            f"reading Service kube-system/kube-dns for the sandbox's resolver: {explain(exc)}; "
            "set dns_servers in the provider config"
        ) from None
    ips: list[str] = list(service.spec.cluster_i_ps or [service.spec.cluster_ip])
    return tuple(ip for ip in ips if ip and ip != "None")
