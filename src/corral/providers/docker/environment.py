"""The `docker` provider.

Per session: a bridge network of its own (so sandboxes cannot reach one another), a
holder container with NET_ADMIN that owns the network namespace, and the sandbox
container that joins it with every capability dropped but the workload's. The baseline
policy is applied and probed before the sandbox container exists.

Both containers end at the session's `corral.expires-at` and the engine removes them
(auto-remove), with no corral process running: a SIGKILLed harness leaks only the
network, which `corral gc` removes. The holder's timer is out of the workload's reach, so
its network ends on time whatever the workload does to its own container's timer.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import AsyncGenerator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, ClassVar

import anyio
import docker
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import DeviceRequest

from corral.core.blocking import limiter
from corral.core.environment import BaseEnvironment
from corral.core.labels import EXPIRES_AT, OWNER, is_expired, new_session_id, session_labels
from corral.core.plan import ExecutionPlan
from corral.core.redact import plain_env
from corral.core.session import EnvironmentSession
from corral.errors import ConfigError, NetworkPolicyNotEnforced, ProviderError
from corral.network.policy import NetworkMode
from corral.network.probe import DISCARD_PORT
from corral.network.targets import EntryType
from corral.providers.docker.config import DockerConfig
from corral.providers.docker.enforcement import apply_policy, dns_servers, resolve
from corral.providers.docker.engine import Engine, call, connect, idempotent
from corral.providers.docker.pool import Pooling, WarmPool, collect_idle
from corral.providers.docker.resources import (
    SubnetTaken,
    create_network,
    discard_container,
    holder_name,
    network_name,
    pick_subnet,
    pick_subnet6,
    pooled_holder_name,
    remove_container,
    remove_network,
    sandbox_name,
)
from corral.providers.docker.session import DockerSession


def sleep_until(expires_at: str) -> list[str]:
    """A main process that ends at `expires_at` (epoch seconds).

    The wait is counted again at every start of the container, so a restart
    (`end_workload`) keeps the deadline; started past it, it exits at once.
    """
    return ["sh", "-c", 'exec sleep "$(( $1 - $(date +%s) ))"', "corral-lifetime", expires_at]


class DockerEnvironment(BaseEnvironment):
    id: ClassVar[str] = "docker"
    config_model = DockerConfig
    supported_network_modes = frozenset(NetworkMode)
    supported_allowlist_entry_types = frozenset(EntryType) - {EntryType.WILDCARD_HOSTNAME}
    supports_network_target_ports = True
    supports_dynamic_network_policy = True
    max_concurrent_opens = 16

    config: DockerConfig

    def __init__(self, config: DockerConfig | None = None, **params: Any) -> None:
        super().__init__(config, **params)
        self._client: Engine | None = None
        self._pool: WarmPool | None = None
        self._verified_runtimes: set[str] = set()

    @classmethod
    def engine_answers(cls) -> bool:
        try:
            client: Engine = docker.from_env(timeout=3)
            client.ping()
            client.close()
        except (DockerException, OSError):
            return False
        return True

    def default_demo_image(self) -> str | None:
        return "corral.local/test:bookworm"

    async def client(self) -> Engine:
        if self._client is None:
            client = await anyio.to_thread.run_sync(connect, self.config)
            try:
                await idempotent(self.config.max_workers, client.ping)
            except (DockerException, OSError) as exc:
                client.close()
                raise ProviderError(
                    f"the Docker Engine at {client.api.base_url} does not answer: {exc}"
                ) from None
            self._client = client
        return self._client

    async def _ensure_image(self, client: Engine, image: str) -> None:
        tokens = self.config.max_workers
        policy = self.config.pull_policy
        if policy != "always":
            try:
                await idempotent(tokens, client.api.inspect_image, image)
                return
            except ImageNotFound:
                if policy == "never":
                    raise ConfigError(
                        f"image {image!r} is not on the engine and pull_policy is 'never'"
                    ) from None
        auth = None
        if self.config.registry_username and self.config.registry_password:
            auth = {
                "username": self.config.registry_username,
                "password": self.config.registry_password.get_secret_value(),
            }
        try:
            await call(tokens, client.images.pull, image, auth_config=auth)
        except (APIError, DockerException) as exc:
            reason = getattr(exc, "explanation", None) or type(exc).__name__
            raise ConfigError(f"image {image!r} is not available: {reason}") from None

    async def _image(self, client: Engine, plan: ExecutionPlan) -> str:
        chosen = plan.require_image(self.id)
        if isinstance(chosen, str):
            await self._ensure_image(client, chosen)
            return chosen
        return await self._native_image(client, chosen)

    async def _native_image(self, client: Engine, native: dict[str, Any]) -> str:
        tokens = self.config.max_workers
        if set(native) == {"image_id"}:
            try:
                await idempotent(tokens, client.api.inspect_image, native["image_id"])
            except ImageNotFound:
                raise ConfigError(f"native image_id {native['image_id']!r} not found") from None
            return str(native["image_id"])
        if "build_context" in native and set(native) <= {"build_context", "dockerfile"}:
            key = hashlib.sha256(json.dumps(native, sort_keys=True).encode()).hexdigest()[:16]
            tag = f"corral-build:{key}"
            try:
                await call(
                    tokens,
                    client.images.build,
                    path=str(native["build_context"]),
                    dockerfile=native.get("dockerfile"),
                    tag=tag,
                    labels={OWNER: self.config.owner},
                    rm=True,
                )
            except (APIError, DockerException, TypeError) as exc:
                raise ConfigError(f"building native {native!r} failed: {exc}") from None
            return tag
        raise ConfigError(
            f"native selector {native!r} is not understood by docker; use "
            "{'image_id': ...} or {'build_context': path, 'dockerfile': optional}"
        )

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
        # A pooled sandbox already has its own id, so a chosen id is always made anew.
        if self._pool is not None and session_id is None:
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
        cfg = self.config
        tokens = cfg.max_workers
        client = await self.client()
        sid = session_id or new_session_id()
        lifetime = plan.timeouts.max_lifetime_s or cfg.default_lifetime_s
        extra = {**cfg.labels, **plan.labels}
        holder_names = [holder_name(sid)]
        if pooling is not None:
            lifetime += pooling.max_idle_s
            extra |= pooling.labels()
            holder_names.insert(0, pooled_holder_name(sid))
        labels = session_labels(cfg.owner, sid, lifetime, extra)
        image = await self._image(client, plan)
        await self._ensure_image(client, cfg.holder_image)

        net_name = network_name(sid)
        subnet = pick_subnet(cfg.address_pool, cfg.network_prefix_len)
        subnet6 = pick_subnet6(cfg.ipv6_pool)
        owned.push_async_callback(remove_network, client, tokens, net_name, sid, subnet)
        for _ in range(16):
            try:
                await create_network(client, tokens, net_name, labels, subnet, subnet6)
                break
            except SubnetTaken:
                subnet = pick_subnet(cfg.address_pool, cfg.network_prefix_len)
                subnet6 = pick_subnet6(cfg.ipv6_pool)
                owned.push_async_callback(remove_network, client, tokens, net_name, sid, subnet)
        else:
            raise ProviderError(f"no free subnet in address_pool {cfg.address_pool}")
        gateway = next(subnet.hosts())

        for name in holder_names:
            owned.push_async_callback(remove_container, client, tokens, name, sid)
        holder_config = client.api.create_host_config(
            network_mode=net_name,
            cap_drop=["ALL"],
            cap_add=["NET_ADMIN"],
            security_opt=["no-new-privileges"],
            init=True,
            auto_remove=True,
            extra_hosts=cfg.extra_hosts or None,
            port_bindings={p: ("127.0.0.1", None) for p in cfg.published_ports} or None,
            pids_limit=64,
        )
        try:
            await call(
                tokens,
                client.api.create_container,
                cfg.holder_image,
                sleep_until(labels[EXPIRES_AT]),
                name=holder_names[0],
                labels={**labels, "corral.role": "holder"},
                host_config=holder_config,
                ports=list(cfg.published_ports) or None,
            )
            await call(tokens, client.api.start, holder_names[0])
        except APIError as exc:
            raise ProviderError(
                f"starting the holder from image {cfg.holder_image!r} failed: {exc}"
            ) from None
        holder = await _running(
            client, tokens, holder_names[0], labels, f"holder from image {cfg.holder_image!r}"
        )
        holder_id: str = holder["Id"]
        net_info = holder["NetworkSettings"]["Networks"].get(net_name, {})
        dns = await dns_servers(client.api, tokens, holder_id)
        baseline = await resolve(
            client.api,
            tokens,
            holder_id,
            plan.network.baseline,
            dns=dns,
            extra_hosts=cfg.extra_hosts,
        )
        try:
            await apply_policy(
                client.api,
                tokens,
                holder_id,
                plan.network.baseline,
                baseline,
                probe_candidates=[(gateway, DISCARD_PORT)],
            )
        except NetworkPolicyNotEnforced as exc:
            raise NetworkPolicyNotEnforced(f"sandbox {sid}: {exc}; nothing was kept") from None

        sandbox = sandbox_name(sid)
        owned.push_async_callback(remove_container, client, tokens, sandbox, sid)
        resources = plan.resources
        cpu = resources.cpu or cfg.default_cpu
        memory = resources.memory_mb or cfg.default_memory_mb
        sandbox_config = client.api.create_host_config(
            network_mode=f"container:{holder_id}",
            cap_drop=["ALL"],
            cap_add=[*cfg.capabilities, *cfg.unsafe_capabilities] or None,
            security_opt=["no-new-privileges"],
            init=True,
            auto_remove=True,
            pids_limit=cfg.pids_limit,
            mem_limit=f"{memory}m" if memory else None,
            nano_cpus=int(cpu * 1e9) if cpu else None,
            device_requests=[DeviceRequest(count=resources.gpus, capabilities=[["gpu"]])]
            if resources.gpus
            else None,
            storage_opt={"size": f"{resources.disk_mb}M"} if resources.disk_mb else None,
            binds=[*cfg.mounts, *cfg.unsafe_mounts] or None,
            runtime=cfg.runtime,
        )
        try:
            await call(
                tokens,
                client.api.create_container,
                image,
                plan.command,
                entrypoint=None if plan.command else sleep_until(labels[EXPIRES_AT]),
                name=sandbox,
                labels={**labels, "corral.role": "sandbox"},
                environment=plain_env(plan.env),
                working_dir=plan.workdir,
                # Execs run as cfg.user (the session's default). The container itself runs
                # as the image's user unless plan.command is the workload: engines before
                # 23.0 give `exec(user="0")` no capabilities in a container created with a
                # non-root user.
                user=cfg.user if plan.command else None,
                host_config=sandbox_config,
            )
            await call(tokens, client.api.start, sandbox)
        except APIError as exc:
            raise ProviderError(
                f"starting the sandbox from image {image!r} failed: {exc}"
            ) from None
        started = await _running(
            client,
            tokens,
            sandbox,
            labels,
            f"sandbox from image {image!r}",
            "or a plan.command that keeps running",
        )
        ports: dict[str, list[dict[str, str]] | None] = holder["NetworkSettings"].get("Ports") or {}
        published = {
            int(key.split("/")[0]): int(bindings[0]["HostPort"])
            for key, bindings in ports.items()
            if bindings
        }
        session = DockerSession(
            id=sid,
            policy=plan.network.baseline,
            client=client,
            tokens=tokens,
            holder=holder_id,
            sandbox=started["Id"],
            network=net_name,
            gateway=gateway,
            holder_address=net_info.get("IPAddress", ""),
            dns=dns,
            extra_hosts=cfg.extra_hosts,
            published=published,
            local_engine=client.api.base_url.startswith("http+docker://"),
            user=cfg.user,
            output_limit=cfg.output_limit_bytes,
            default_timeout=plan.timeouts.operation_s,
            resolver_image=cfg.holder_image,
            labels=labels,
            workdir=started["Config"].get("WorkingDir") or "/",
            runtime=started["HostConfig"].get("Runtime") or "runc",
            verified_runtimes=self._verified_runtimes,
            exec_channel=cfg.exec_channel,
        )
        session.image = image
        session.resolution = baseline
        try:
            await session.check_runtime(plan.network.baseline)
        except NetworkPolicyNotEnforced as exc:
            raise NetworkPolicyNotEnforced(f"sandbox {sid}: {exc}; nothing was kept") from None
        return session

    async def gc(self) -> list[str]:
        """Remove idle pooled sandboxes past their idle age, then expired containers and
        networks, all carrying this owner's labels."""
        client = await self.client()
        tokens = self.config.max_workers
        owner = self.config.owner
        now = time.time()
        removed = await collect_idle(client, tokens, owner, now)
        containers: list[dict[str, Any]] = await idempotent(
            tokens, client.api.containers, all=True, filters={"label": f"{OWNER}={owner}"}
        )
        for item in containers:
            if is_expired(item.get("Labels") or {}, owner, now):
                await discard_container(client, tokens, item["Id"])
                removed.append(f"container {item['Names'][0].lstrip('/')}")
        networks: list[dict[str, Any]] = await idempotent(
            tokens, client.api.networks, filters={"label": f"{OWNER}={owner}"}
        )
        for item in networks:
            if is_expired(item.get("Labels") or {}, owner, now):
                with contextlib.suppress(NotFound):
                    await idempotent(tokens, client.api.remove_network, item["Id"])
                    removed.append(f"network {item['Name']}")
        return removed


async def _running(
    client: Engine,
    tokens: int,
    name: str,
    labels: dict[str, str],
    what: str,
    otherwise: str = "",
) -> dict[str, Any]:
    """The started container `name`, or a ProviderError saying why it already ended."""
    try:
        info: dict[str, Any] = await idempotent(tokens, client.api.inspect_container, name)
        state: dict[str, Any] = info["State"]
    except NotFound:  # it ended and the engine removed it (auto-remove)
        info, state = {}, {}
    if state.get("Running"):
        return info
    if int(labels[EXPIRES_AT]) <= time.time():
        raise ProviderError(f"the sandbox's lifetime ended while it opened ({what})")
    raise ProviderError(
        f"{what} exited at once (code {state.get('ExitCode', 'unknown')}); it needs `sh`, "
        f"`date` and `sleep` {otherwise}".strip()
    )
