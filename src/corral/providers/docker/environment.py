"""The `docker` provider.

Per session: a bridge network of its own (so sandboxes cannot reach one another), a
holder container with NET_ADMIN that owns the network namespace, and the sandbox
container that joins it with every capability dropped but the workload's. The baseline
policy is applied and probed before the sandbox container exists.

A session is found again by its id (`attach`, `open(plan, session_id=…)`, also from another
process): the engine's labels name its containers, and the policy in force is read back
from the holder's kernel rules, which carry it (`network.policy_record`). `session.save()`
commits the sandbox container to a local image (`snapshots`) that `fork` starts from.

The plan's services are containers in the holder's namespace too (`services`), started
once the baseline is in force; `exec(..., service=)` and the file calls reach them.

Both containers end at the session's `corral.expires-at`, with no corral process running.
The engine removes the holder then (auto-remove); the sandbox stays, stopped, with the
network (and the services, which run their own commands) until `corral gc` removes them:
a SIGKILLed harness leaks nothing that runs. The sandbox is not auto-removed because
`end_workload` restarts it, and Engine 20.10's restart of an auto-remove container can lose
it (its exit handler reads the flag the restart has already set back). The holder's timer
is out of the workload's reach, so its network ends on time whatever the workload does to
its own container's timer.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import time
import weakref
from collections.abc import AsyncGenerator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, ClassVar

import anyio
import docker
from docker.errors import APIError, DockerException, NotFound
from docker.types import LogConfig

from corral.core.blocking import limiter
from corral.core.credentials import credential_env_of
from corral.core.credproxy import CredentialProxy
from corral.core.environment import BaseEnvironment
from corral.core.labels import (
    EXPIRES_AT,
    OWNER,
    SESSION,
    is_expired,
    new_session_id,
    session_labels,
)
from corral.core.logs import event
from corral.core.plan import ExecutionPlan
from corral.core.redact import plain_env
from corral.core.services import wait_healthy
from corral.core.session import EnvironmentSession
from corral.core.snapshot import SnapshotRef
from corral.errors import (
    ConfigError,
    FeatureUnsupported,
    NetworkPolicyNotEnforced,
    ProviderError,
    SessionIdTaken,
)
from corral.helper import WithHelper
from corral.network.events import EventLog
from corral.network.iptables import Endpoint
from corral.network.policy import NetworkMode, NetworkPolicy, Phase
from corral.network.probe import DISCARD_PORT
from corral.network.resolve import Resolution
from corral.network.targets import EntryType, IPAddress
from corral.network.wildcard import uses_resolver
from corral.providers.docker import gateway, images, programs, snapshots
from corral.providers.docker.config import DockerConfig
from corral.providers.docker.enforcement import (
    Upstream,
    apply_policy,
    dns_servers,
    install_resolver,
    policy_in_force,
    resolve,
)
from corral.providers.docker.engine import Engine, Raw, connect
from corral.providers.docker.events import EventFeed, EventsUnavailable, start_reader
from corral.providers.docker.holder_net import HolderNet, gateway_of, network_endpoint
from corral.providers.docker.own_kernel import own_tmp
from corral.providers.docker.pool import Pooling, WarmPool, collect_idle
from corral.providers.docker.resources import (
    ROLE,
    NameTaken,
    SubnetTaken,
    create_network,
    create_volume,
    discard_container,
    holder_name,
    live_pair,
    net_name,
    network_name,
    pick_subnet,
    pick_subnet6,
    pooled_holder_name,
    programs_volume,
    release_subnet,
    remove_container,
    remove_network,
    remove_volume,
    sandbox_name,
)
from corral.providers.docker.services import (
    SERVICES,
    find_services,
    resource_limits,
    running_service,
    service_container,
    service_names,
    start_service,
)
from corral.providers.docker.session import DockerSession

log = logging.getLogger("corral.docker")

#: The holder's process budget: corral's own commands there (switches, probes, lookups)
#: share it only with the resolver, whose forks are bounded (helper/dns.go, maxSetWriters)
#: far below it, so no query flood from the sandbox can spend it.
HOLDER_PIDS = 128
#: looks, 0.2 s apart, for a second network of the session's name to go
UNIQUE_TRIES = 50
#: Network creates under way in this process, by name: the engine checks a new network's
#: name only against networks it has finished creating, so two opens of one id at once
#: would both make one. Across processes `_network_unique` narrows that window.
_creating: weakref.WeakValueDictionary[str, anyio.Lock] = weakref.WeakValueDictionary()


#: the sandbox's log driver: root in the sandbox can open its PID 1's stdout (/proc/1/fd/1),
#: and with a driver whatever it writes there the engine would encode and keep on the
#: host's disk, without end; corral never reads a sandbox's log
NO_LOG = LogConfig(type=LogConfig.types.NONE)


def sleep_until(expires_at: str) -> list[str]:
    """The holder's main process (its image is corral's): it ends at `expires_at` (epoch
    seconds), counted again at every start. The sandbox's is `programs.main_process`."""
    return ["sh", "-c", 'exec sleep "$(( $1 - $(date +%s) ))"', "corral-lifetime", expires_at]


class DockerEnvironment(BaseEnvironment):
    id: ClassVar[str] = "docker"
    config_model = DockerConfig
    supported_network_modes = frozenset(NetworkMode)
    supported_allowlist_entry_types = WithHelper(  # type: ignore[assignment]
        frozenset(EntryType),
        frozenset(EntryType) - {EntryType.HOSTNAME, EntryType.WILDCARD_HOSTNAME},
    )
    supported_denylist_entry_types = frozenset(EntryType) - {EntryType.WILDCARD_HOSTNAME}
    supports_network_target_ports = True
    supports_dynamic_network_policy = True
    supports_reattach = True
    supports_snapshot = True
    supports_network_events = WithHelper(True, False)  # type: ignore[assignment]
    supports_processes = WithHelper(True, False)  # type: ignore[assignment]
    supports_pty = WithHelper(True, False)  # type: ignore[assignment]
    supports_services = True
    supports_credentials = True
    max_concurrent_opens = 16

    config: DockerConfig

    def __init__(self, config: DockerConfig | None = None, **params: Any) -> None:
        super().__init__(config, **params)
        self._engine: Engine | None = None
        self._pool: WarmPool | None = None
        self._verified_runtimes: set[str] = set()
        self._engine_arch: str | None = None

    @classmethod
    def engine_answers(cls) -> bool:
        try:
            client: Raw = docker.from_env(timeout=3)
            client.ping()
            client.close()
        except (DockerException, OSError):
            return False
        return True

    def default_demo_image(self) -> str | None:
        return "corral.local/test:bookworm"

    def _release(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()

    async def engine(self) -> Engine:
        """The engine's client, connected (and pinged) on first use."""
        if self._engine is None:
            engine = Engine(
                await anyio.to_thread.run_sync(connect, self.config), self.config.max_workers
            )
            try:
                await engine.idempotent(engine.api.ping)
            except (DockerException, OSError) as exc:
                engine.close()
                raise ProviderError(
                    f"the Docker Engine at {engine.api.base_url} does not answer: {exc}"
                ) from None
            self._engine = engine
        return self._engine

    async def _arch(self, engine: Engine) -> str:
        """The engine's architecture (`docker version`), asked once."""
        if self._engine_arch is None:
            version: dict[str, Any] = await engine.idempotent(engine.api.version)
            self._engine_arch = str(version.get("Arch", ""))
        return self._engine_arch

    @asynccontextmanager
    async def warm_pool(
        self,
        *plans: ExecutionPlan,
        size_per_key: int | None = None,
        max_idle_s: float | None = None,
    ) -> AsyncGenerator[WarmPool]:
        """Keep sandboxes for `plans` made ahead while the block runs; drain them after.

        Inside the block, `open()` with a plan of the same pool key (image, baseline policy,
        env, resources, workdir, command, labels, max_lifetime_s) takes a ready sandbox,
        under its baseline, and the pool refills in the background; other plans open cold.
        Defaults: `warm_pool_size` per key, `warm_pool_max_idle_s`. One pool at a time.
        """
        if self._pool is not None:
            raise ConfigError(
                f"{self!r} already runs warm pool {self._pool.id}; give one pool every plan"
            )
        pool = WarmPool(
            self._make_pooled,
            [self.prepare(plan) for plan in plans],
            size=size_per_key or self.config.warm_pool_size,
            max_idle_s=max_idle_s or self.config.warm_pool_max_idle_s,
        )
        self._pool = pool
        try:
            async with pool.running():
                yield pool
        finally:
            self._pool = None

    async def _make_pooled(
        self, plan: ExecutionPlan, owned: AsyncExitStack, pooling: Pooling
    ) -> DockerSession:
        async with limiter(f"open:{self.id}", self.max_concurrent_opens):
            return await self._create(plan, owned, pooling, None)

    async def _open(
        self, plan: ExecutionPlan, owned: AsyncExitStack, *, session_id: str | None
    ) -> EnvironmentSession:
        # A pooled sandbox already has its own id, so a chosen id is always made anew; nor
        # does it have credential routes (a proxy, and its URLs in the sandbox's env).
        if self._pool is not None and session_id is None and not plan.credentials:
            session = await self._pool.take(plan, owned)
            if session is not None:
                return session
        return await self._create(plan, owned, None, session_id)

    async def _create(
        self,
        plan: ExecutionPlan,
        owned: AsyncExitStack,
        pooling: Pooling | None,
        session_id: str | None,
    ) -> DockerSession:
        engine = await self.engine()
        self._gateway_carries(plan)
        sid = session_id or new_session_id()
        labels = self._labels(plan, pooling, sid)
        holder_names = [holder_name(sid)]
        if pooling is not None:
            holder_names.insert(0, pooled_holder_name(sid))
        image = await images.for_plan(engine, plan, self.config, self.id)
        await images.ensure(engine, self.config.holder_image, self.config)
        for spec in plan.services.values():
            await images.ensure(engine, spec.image, self.config)
        network = await self._make_network(engine, owned, sid, labels)
        volume = programs_volume(sid)
        owned.push_async_callback(remove_volume, engine, volume, sid)
        await create_volume(engine, volume, labels)
        holder = await self._start_holder(engine, owned, sid, network, volume, labels, holder_names)
        await programs.fill(engine, holder, await self._arch(engine))
        # Before any rule logs: every refusal from the baseline's on is read.
        feed = await self._start_events(engine, owned, sid, holder["Id"])
        dns = await dns_servers(engine, holder["Id"])
        phase_of: list[DockerSession] = []  # the session, once there is one
        proxy = await self._start_proxy(engine, owned, sid, holder, plan, phase_of)
        endpoints = () if proxy is None else ((gateway_of(holder, sid), proxy.port),)
        baseline = await self._apply_baseline(
            engine, sid, holder, plan.network.baseline, dns, feed.log, labels, plan, endpoints
        )
        if proxy is not None:  # the sandbox gets the routes' URLs, never their headers
            plan = plan.model_copy(update={"env": {**plan.env, **proxy.env()}})
        namespace = await self._namespace(engine, owned, sid, holder, labels)
        sandbox = await self._start_sandbox(engine, owned, sid, namespace, image, plan, labels)
        session = self._session(
            engine,
            holder,
            sandbox,
            policy=plan.network.baseline,
            dns=dns,
            labels=labels,
            default_timeout=plan.timeouts.operation_s,
            phase="baseline",
            events=feed,
            endpoints=endpoints,
            resolution=baseline,
        )
        phase_of.append(session)
        # Unwound first: the exec channel's stream and reader thread end with the session.
        owned.push_async_callback(session.executor.aclose)
        owned.push_async_callback(session.procs.aclose)
        try:
            await session.net.check_runtime(plan.network.baseline)
        except NetworkPolicyNotEnforced as exc:
            raise NetworkPolicyNotEnforced(f"sandbox {sid}: {exc}; nothing was kept") from None
        await self._start_services(engine, owned, session, plan, labels)
        return session

    async def _namespace(
        self,
        engine: Engine,
        owned: AsyncExitStack,
        sid: str,
        holder: dict[str, Any],
        labels: dict[str, str],
    ) -> str:
        """The container whose network namespace the sandbox joins: the holder's, or under
        a gateway a net container's, linked to the holder."""
        if not self.config.routed:
            return str(holder["Id"])
        return await gateway.start_net(
            engine,
            owned,
            sid,
            holder,
            labels,
            image=self.config.holder_image,
            command=sleep_until(labels[EXPIRES_AT]),
            extra_hosts=self.config.extra_hosts,
        )

    def _gateway_carries(self, plan: ExecutionPlan) -> None:
        """Refuse, before anything is made, what a gateway does not carry yet."""
        if self.config.routed and plan.services:
            raise FeatureUnsupported(
                f"services ({', '.join(plan.services)}) under runtime {self.config.runtime!r}, "
                "behind a gateway, would share the sandbox's network stack, which that runtime "
                "takes for its own; not supported yet: use runc"
            )

    def _labels(self, plan: ExecutionPlan, pooling: Pooling | None, sid: str) -> dict[str, str]:
        """Every label of the session's objects: owner, session, expiry (a pooled one's
        includes its idle time), the config's and the plan's, the pool's, the services'."""
        cfg = self.config
        lifetime = plan.timeouts.max_lifetime_s or cfg.default_lifetime_s
        extra = {**cfg.labels, **plan.labels}
        if pooling is not None:
            lifetime += pooling.max_idle_s
            extra |= pooling.labels()
        if plan.services:
            extra[SERVICES] = ",".join(plan.services)
        return session_labels(cfg.owner, sid, lifetime, extra)

    async def _make_network(
        self, engine: Engine, owned: AsyncExitStack, sid: str, labels: dict[str, str]
    ) -> str:
        """The session's own bridge network; returns its id."""
        cfg = self.config
        name = network_name(sid)
        for _ in range(16):
            subnet = pick_subnet(cfg.address_pool, cfg.network_prefix_len)
            owned.callback(release_subnet, subnet)
            # By name until the engine answers with an id: a create cut short may land.
            undo = _withdrawable(owned)
            undo.push_async_callback(remove_network, engine, name, sid)
            lock = _creating.setdefault(name, anyio.Lock())
            try:
                async with lock:
                    created = await create_network(
                        engine, name, labels, subnet, pick_subnet6(cfg.ipv6_pool)
                    )
            except SubnetTaken:
                undo.pop_all()
                continue
            except NameTaken:
                undo.pop_all()  # another open's network
                raise SessionIdTaken(f"session_id {sid!r}: network {name!r} exists") from None
            # Opens of one id in two processes at once may both create a network of this
            # name: from here on, only this one is ours.
            undo.pop_all()
            owned.push_async_callback(remove_network, engine, created["Id"], sid)
            return str(created["Id"])
        raise ProviderError(f"no free subnet in address_pool {cfg.address_pool}")

    async def _start_holder(
        self,
        engine: Engine,
        owned: AsyncExitStack,
        sid: str,
        network: str,
        volume: str,
        labels: dict[str, str],
        names: list[str],
    ) -> dict[str, Any]:
        """The holder on `network` (an id: its name may be repeated), with the programs
        `volume` writable, started; inspected."""
        cfg = self.config
        undo = _withdrawable(owned)
        for name in names:
            undo.push_async_callback(remove_container, engine, name, sid)
        host_config = engine.api.create_host_config(
            network_mode=network,
            cap_drop=["ALL"],
            # NET_RAW: iptables' set match (allowlists naming hosts) looks sets up over a raw
            # socket. Only corral's own commands run here; the sandbox gets neither.
            cap_add=["NET_ADMIN", "NET_RAW"],
            security_opt=["no-new-privileges"],
            init=True,
            auto_remove=True,
            sysctls=gateway.HOLDER_SYSCTLS if cfg.routed else None,
            extra_hosts=cfg.extra_hosts or None,
            port_bindings={p: ("127.0.0.1", None) for p in cfg.published_ports} or None,
            binds=[programs.bind(volume, writable=True)],
            pids_limit=HOLDER_PIDS,
        )
        try:
            await engine.call(
                engine.api.create_container,
                cfg.holder_image,
                sleep_until(labels[EXPIRES_AT]),
                name=names[0],
                labels={**labels, ROLE: "holder"},
                host_config=host_config,
                ports=list(cfg.published_ports) or None,
            )
        except APIError as exc:
            if exc.status_code == 409:  # the name: another open of this id came first
                undo.pop_all()
                raise SessionIdTaken(f"session_id {sid!r}: {exc.explanation}") from None
            raise ProviderError(
                f"creating the holder from image {cfg.holder_image!r} failed: {exc}"
            ) from None
        await _network_unique(engine, network_name(sid))
        try:
            await engine.call(engine.api.start, names[0])
        except APIError as exc:
            raise ProviderError(
                f"starting the holder from image {cfg.holder_image!r} failed: {exc}"
            ) from None
        return await _running(engine, names[0], labels, f"holder from image {cfg.holder_image!r}")

    async def _start_proxy(
        self,
        engine: Engine,
        owned: AsyncExitStack,
        sid: str,
        holder: dict[str, Any],
        plan: ExecutionPlan,
        phase_of: list[DockerSession],
    ) -> CredentialProxy | None:
        """The plan's credential routes served on the session network's gateway (this
        host's side of the bridge), to the sandbox's address only; None without routes."""
        if not plan.credentials:
            return None
        if not engine.api.base_url.startswith("http+docker://"):
            raise FeatureUnsupported(
                f"credentials (the plan routes {', '.join(plan.credentials)}) need the Docker "
                f"Engine on this host (corral's proxy serves on the session network's gateway); "
                f"this one is {engine.api.base_url}"
            )
        endpoint = network_endpoint(holder, sid)
        proxy = CredentialProxy(
            plan.credentials,
            host=str(gateway_of(holder, sid)),
            peers={a for a in (endpoint.get("IPAddress"), endpoint.get("GlobalIPv6Address")) if a},
            phase=lambda: phase_of[0].phase if phase_of else "baseline",
            sandbox_id=sid,
        )
        await anyio.to_thread.run_sync(proxy.start)
        owned.push_async_callback(anyio.to_thread.run_sync, proxy.close)
        return proxy

    async def _start_events(
        self, engine: Engine, owned: AsyncExitStack, sid: str, holder: str
    ) -> EventFeed:
        """The denied-egress reader in the holder, stopped with the session, or why there
        is none (logged: a sandbox without events still works)."""
        events = EventLog(self.config.network_events_limit)
        if not self.config.network_events:
            return EventFeed(events, None, "turned off (network_events=False)")
        try:
            reader = await start_reader(engine, holder, events, sid)
        except EventsUnavailable as exc:
            event(log, "warning", "network events unavailable", sandbox=sid, reason=str(exc))
            return EventFeed(events, None, str(exc))
        owned.push_async_callback(reader.aclose)
        return EventFeed(events, reader, None)

    async def _apply_baseline(
        self,
        engine: Engine,
        sid: str,
        holder: dict[str, Any],
        policy: NetworkPolicy,
        dns: tuple[IPAddress, ...],
        events: EventLog,
        labels: dict[str, str],
        plan: ExecutionPlan,
        endpoints: tuple[Endpoint, ...],
    ) -> Resolution:
        """`policy` in force in the holder's namespace, probed, before any sandbox joins
        (and corral's resolver bound, if any phase's allowlist names a host: see
        network.wildcard)."""
        cfg = self.config
        start_resolver = any(uses_resolver(p) for _, p in plan.network.items())
        if start_resolver:
            # A fresh holder has no resolver binary yet: put it in at once rather than
            # after a refused first try (corral's lookups need it too).
            await install_resolver(engine, holder["Id"])
        resolved = await resolve(
            engine,
            holder["Id"],
            policy,
            dns=dns,
            extra_hosts=cfg.extra_hosts,
            upstream=self._upstream(labels),
        )
        try:
            await apply_policy(
                engine,
                holder["Id"],
                policy,
                resolved,
                probe_candidates=[(gateway_of(holder, sid), DISCARD_PORT)],
                phase="baseline",
                events=events,
                start_resolver=start_resolver,
                endpoints=endpoints,
            )
        except NetworkPolicyNotEnforced as exc:
            raise NetworkPolicyNotEnforced(f"sandbox {sid}: {exc}; nothing was kept") from None
        return resolved

    async def _start_sandbox(
        self,
        engine: Engine,
        owned: AsyncExitStack,
        sid: str,
        namespace: str,
        image: str,
        plan: ExecutionPlan,
        labels: dict[str, str],
    ) -> dict[str, Any]:
        """The sandbox container in container `namespace`'s network namespace, started."""
        cfg = self.config
        sandbox = sandbox_name(sid)
        owned.push_async_callback(remove_container, engine, sandbox, sid)
        mounts = [*cfg.mounts, *cfg.unsafe_mounts]
        host_config = engine.api.create_host_config(
            network_mode=f"container:{namespace}",
            cap_drop=["ALL"],
            cap_add=[*cfg.capabilities, *cfg.unsafe_capabilities] or None,
            security_opt=["no-new-privileges"],
            init=True,
            auto_remove=False,  # restarted by end_workload (the module's docstring says why)
            pids_limit=cfg.pids_limit,
            binds=[programs.bind(programs_volume(sid), writable=False), *mounts],
            runtime=cfg.runtime,
            log_config=NO_LOG,
            mounts=own_tmp(cfg.runtime, labels, mounts),
            **resource_limits(plan.resources, cfg),
        )
        try:
            await engine.call(
                engine.api.create_container,
                image,
                plan.command,
                entrypoint=None if plan.command else programs.main_process(labels[EXPIRES_AT]),
                name=sandbox,
                labels={**labels, ROLE: "sandbox"},
                environment=plain_env(plan.env),
                working_dir=plan.workdir,
                # Execs run as cfg.user (the session's default). The container itself runs
                # as the image's user unless plan.command is the workload: engines before
                # 23.0 give `exec(user="0")` no capabilities in a container created with a
                # non-root user.
                user=cfg.user if plan.command else None,
                host_config=host_config,
            )
            await engine.call(engine.api.start, sandbox)
        except APIError as exc:
            raise ProviderError(
                f"starting the sandbox from image {image!r} failed: {exc}"
            ) from None
        return await _running(
            engine,
            sandbox,
            labels,
            f"sandbox from image {image!r}",
            "(a plan.command must keep running)" if plan.command else "",
        )

    async def _start_services(
        self,
        engine: Engine,
        owned: AsyncExitStack,
        session: DockerSession,
        plan: ExecutionPlan,
        labels: dict[str, str],
    ) -> None:
        """The plan's services in the holder's namespace (`services`), under the policy in
        force, started; returns once each with a healthcheck passed it."""
        sid = session.id
        for name, service in plan.services.items():
            spec = service_container(sid, name, service, session.net.holder, labels, self.config)
            owned.push_async_callback(remove_container, engine, spec.name, sid)
            info = await start_service(engine, spec, service, sid)
            session.add_service(name, info)
            event(log, "info", "service started", sandbox=sid, service=name, image=spec.image)
        await wait_healthy(session, plan.services)
        # Healthy, or without a check: each must still run when open() returns.
        for name, service in plan.services.items():
            container = session.service_containers[name].id
            await running_service(engine, container, service, sid)

    def _upstream(self, labels: dict[str, str]) -> Upstream:
        """Where corral's resolver forwards the names an allowlist allows (and where corral
        resolves them at apply time)."""
        servers = self.config.upstream_dns_servers or ()
        return Upstream(
            tuple(ipaddress.ip_address(a) for a in servers) or None,
            self.config.holder_image,
            labels,
        )

    def _session(
        self,
        engine: Engine,
        holder: dict[str, Any],
        sandbox: dict[str, Any],
        *,
        policy: NetworkPolicy,
        dns: tuple[IPAddress, ...],
        labels: dict[str, str],
        default_timeout: float | None,
        phase: Phase | None,
        events: EventFeed,
        endpoints: tuple[Endpoint, ...] = (),
        resolution: Resolution | None = None,
    ) -> DockerSession:
        """A session over a running holder and sandbox, from what the engine says of them."""
        cfg = self.config
        sid = labels[SESSION]
        joined: str = sandbox["HostConfig"].get("NetworkMode") or ""
        net = HolderNet(
            engine,
            holder,
            session_id=sid,
            sandbox=sandbox["Id"],
            runtime=sandbox["HostConfig"].get("Runtime") or "runc",
            link_owner=None
            if joined == f"container:{holder['Id']}"
            else joined.removeprefix("container:"),
            dns=dns,
            extra_hosts=cfg.extra_hosts,
            labels=labels,
            upstream=self._upstream(labels),
            verified_runtimes=self._verified_runtimes,
            events=events.log,
            endpoints=endpoints,
            resolution=resolution,
        )
        session = DockerSession(
            id=sid,
            policy=policy,
            engine=engine,
            net=net,
            sandbox=sandbox["Id"],
            user=cfg.user,
            output_limit=cfg.output_limit_bytes,
            default_timeout=default_timeout,
            labels=labels,
            workdir=sandbox["Config"].get("WorkingDir") or "/",
            # As the engine holds the container's config: corral wrote it, the sandbox can't.
            credential_env=credential_env_of(sandbox["Config"].get("Env") or []),
            image=sandbox["Config"]["Image"],
            # Every service of the plan is one of the session's; one whose container is gone
            # is named in errors, never silently unknown.
            services=service_names(labels),
            exec_channel=cfg.exec_channel,
            snapshot_lifetime_s=cfg.snapshot_lifetime_s,
            phase=phase,
            events=events,
        )
        return session

    async def _reattach(self, session_id: str) -> tuple[EnvironmentSession, AsyncExitStack] | None:
        """The live sandbox `session_id` of this owner, with the policy the holder's
        namespace enforces, read back from the kernel (never from this process's memory)."""
        engine = await self.engine()
        pair = await live_pair(engine, self.config.owner, session_id)
        if pair is None:
            return None
        holder, sandbox = pair
        record, phase = await policy_in_force(engine, holder["Id"])
        labels = {k: v for k, v in holder["Config"]["Labels"].items() if k != ROLE}
        services = await find_services(engine, self.config.owner, session_id, holder["Id"])
        # From now on: what was refused before this process found the sandbox went with
        # the reader of the process that had it.
        readers = AsyncExitStack()
        feed = await self._start_events(engine, readers, session_id, holder["Id"])
        try:
            session = self._session(
                engine,
                holder,
                sandbox,
                policy=record.policy,
                dns=record.dns_servers,
                labels=labels,
                default_timeout=None,
                phase=phase,
                events=feed,
            )
            for name, info in services.items():
                session.add_service(name, info)
            await session.follow_names()
        except BaseException:
            # Found, not created: only the reader this call started is undone.
            with anyio.CancelScope(shield=True):
                await readers.aclose()
            raise
        owned = AsyncExitStack()
        owned.push_async_callback(remove_network, engine, session.net.network, session_id)
        owned.push_async_callback(remove_volume, engine, programs_volume(session_id), session_id)
        owned.push_async_callback(remove_container, engine, holder["Id"], session_id)
        owned.push_async_callback(remove_container, engine, net_name(session_id), session_id)
        owned.push_async_callback(remove_container, engine, sandbox["Id"], session_id)
        for info in services.values():
            owned.push_async_callback(remove_container, engine, info["Id"], session_id)
        owned.push_async_callback(readers.aclose)
        owned.push_async_callback(session.executor.aclose)
        owned.push_async_callback(session.procs.aclose)
        return session, owned

    async def _from_snapshot(self, ref: SnapshotRef, plan: ExecutionPlan) -> ExecutionPlan:
        """The plan, opening from `ref`'s image (its own env, command and policies kept)."""
        engine = await self.engine()
        image_id = await snapshots.find(engine, self.config.owner, ref)
        return plan.model_copy(update={"native": {"image_id": image_id}})

    async def _discard_snapshot(self, ref: SnapshotRef) -> None:
        engine = await self.engine()
        await snapshots.discard(engine, self.config.owner, ref)

    async def gc(self) -> list[str]:
        """Remove idle pooled sandboxes past their idle age, then expired snapshot images,
        containers, networks and volumes, all carrying this owner's labels."""
        engine = await self.engine()
        owner = self.config.owner
        now = time.time()
        removed = await collect_idle(engine, owner, now)
        removed += await snapshots.collect_expired(engine, owner, now)
        containers: list[dict[str, Any]] = await engine.idempotent(
            engine.api.containers, all=True, filters={"label": f"{OWNER}={owner}"}
        )
        for item in containers:
            if is_expired(item.get("Labels") or {}, owner, now):
                await discard_container(engine, item["Id"])
                removed.append(f"container {item['Names'][0].lstrip('/')}")
        networks: list[dict[str, Any]] = await engine.idempotent(
            engine.api.networks, filters={"label": f"{OWNER}={owner}"}
        )
        for item in networks:
            if is_expired(item.get("Labels") or {}, owner, now):
                with contextlib.suppress(NotFound):
                    await engine.idempotent(engine.api.remove_network, item["Id"])
                    removed.append(f"network {item['Name']}")
        answer: dict[str, Any] = await engine.idempotent(
            engine.api.volumes, filters={"label": f"{OWNER}={owner}"}
        )
        volumes: list[dict[str, Any]] = answer.get("Volumes") or []
        for item in volumes:
            if is_expired(item.get("Labels") or {}, owner, now):
                with contextlib.suppress(NotFound):
                    await engine.idempotent(engine.api.remove_volume, item["Name"], force=True)
                    removed.append(f"volume {item['Name']}")
        return removed


def _withdrawable(owned: AsyncExitStack) -> AsyncExitStack:
    """A stack of undos unwound with `owned`, or withdrawn (`.pop_all()`) once the engine
    says the create they undo made nothing of ours (the name is another open's)."""
    stack = AsyncExitStack()
    owned.push_async_callback(stack.aclose)
    return stack


async def _network_unique(engine: Engine, name: str) -> None:
    """Wait until `name` names one network only.

    Opens of one chosen id in two processes at once may both create its network (see
    `_creating`). The open whose holder loses the name removes its network; until then the
    engine, which starts a container's networks by name, would refuse to start the
    winner's holder (and auto-remove it). A create still under way when this looks can
    still make that start fail: an error, never a second sandbox.
    """
    for _ in range(UNIQUE_TRIES):
        listed: list[dict[str, Any]] = await engine.idempotent(engine.api.networks, names=[name])
        if sum(item["Name"] == name for item in listed) <= 1:
            return
        await anyio.sleep(0.2)
    raise ProviderError(f"another network named {name!r} stayed for {UNIQUE_TRIES * 0.2:.0f} s")


async def _running(
    engine: Engine,
    name: str,
    labels: dict[str, str],
    what: str,
    otherwise: str = "",
) -> dict[str, Any]:
    """The started container `name`, or a ProviderError saying why it already ended."""
    try:
        info: dict[str, Any] = await engine.idempotent(engine.api.inspect_container, name)
        state: dict[str, Any] = info["State"]
    except NotFound:  # it ended and the engine removed it (the holder: auto-remove)
        info, state = {}, {}
    if state.get("Running"):
        return info
    if int(labels[EXPIRES_AT]) <= time.time():
        raise ProviderError(f"the sandbox's lifetime ended while it opened ({what})")
    raise ProviderError(
        f"{what} exited at once (code {state.get('ExitCode', 'unknown')}) {otherwise}".strip()
    )
