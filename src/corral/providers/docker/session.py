"""A `docker` sandbox: the sandbox container, the holder that owns its network, and the
plan's services in that network (`services`)."""

from __future__ import annotations

import functools
import ipaddress
import logging
import posixpath
import secrets
from collections.abc import AsyncGenerator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anyio
from anyio.lowlevel import EventLoopToken
from docker.errors import APIError, NotFound

from corral.core.labels import OWNER
from corral.core.logs import event
from corral.core.plan import ExecutionPlan
from corral.core.processes import ProcessManager, StartRequest
from corral.core.session import EnvironmentSession, ExecRequest, ExecResult
from corral.core.snapshot import SnapshotRef
from corral.core.tarsafe import extract_file, extract_tar, pack_dir, pack_file, validate_dir
from corral.errors import (
    FeatureUnsupported,
    NetworkPolicyNotEnforced,
    ProviderError,
    RemotePathNotFound,
    WorkloadNotStopped,
)
from corral.helper.channel import Executor, PlainExecutor
from corral.helper.link import ChannelUnavailable
from corral.helper.procs import ProcessClient, ProcessLink
from corral.network.events import EventLog, NetworkEvents
from corral.network.iptables import Endpoint
from corral.network.policy import NetworkPolicy, Phase
from corral.network.probe import DISCARD_PORT, forbidden_probe
from corral.network.resolve import Resolution, needs_dns
from corral.network.targets import EntryType, IPAddress
from corral.network.wildcard import uses_resolver
from corral.providers.docker import programs, snapshots
from corral.providers.docker.channel import (
    ChannelExecutor,
    Defaults,
    container_defaults,
    start_program,
)
from corral.providers.docker.enforcement import (
    Upstream,
    apply_policy,
    probe_from_sandbox,
    resolve,
)
from corral.providers.docker.engine import Engine
from corral.providers.docker.events import EventFeed
from corral.providers.docker.execution import run_exec
from corral.providers.docker.landing import SandboxFiles
from corral.providers.docker.resources import remove_container

log = logging.getLogger("corral.docker")

#: Seconds the sandbox's init gets to end on SIGTERM in `end_workload` before the engine
#: kills it. It ends at once (the engine's init, whose only child is corral's busybox idling,
#: and no workload can make either ignore SIGTERM), so this is paid only with a
#: `plan.command` that ignores it.
RESTART_GRACE_S = 10
#: the engine's init (`init=True`), bind-mounted read-only from the engine's host
ENGINE_INIT = "/sbin/docker-init"


@dataclass(frozen=True)
class Container:
    """Where a call lands: the sandbox container or a service's, and its working dir."""

    id: str
    workdir: str
    service: str | None = None


class DockerSession(EnvironmentSession):
    _tools = (programs.BUSYBOX,)

    def __init__(
        self,
        *,
        id: str,
        policy: NetworkPolicy,
        engine: Engine,
        holder: str,
        sandbox: str,
        network: str,
        gateway: IPAddress,
        holder_address: str,
        dns: tuple[IPAddress, ...],
        extra_hosts: dict[str, str],
        published: dict[int, int],
        local_engine: bool,
        user: str | None,
        output_limit: int,
        default_timeout: float | None,
        resolver_image: str,
        labels: dict[str, str],
        workdir: str,
        runtime: str,
        verified_runtimes: set[str],
        exec_channel: bool,
        snapshot_lifetime_s: float,
        phase: Phase | None,
        events: EventFeed,
        upstream_dns_servers: tuple[str, ...] | None = None,
        endpoints: tuple[Endpoint, ...] = (),
        credential_env: Mapping[str, str] | None = None,
        image: str = "",
        services: tuple[str, ...] = (),
        resolution: Resolution | None = None,
    ) -> None:
        super().__init__(
            id=id, policy=policy, image=image, services=services, credential_env=credential_env
        )
        self.phase = phase
        #: refused attempts, fed by the reader in the holder (`providers.docker.events`)
        self.feed = events
        self.events: EventLog = events.log
        self.engine = engine
        self.holder = holder
        self.sandbox = sandbox
        self.network = network
        self.gateway = gateway
        self.holder_address = holder_address
        self.dns = dns
        self.extra_hosts = extra_hosts
        #: what the policy in force was resolved to (None: not known, resolve afresh)
        self.resolution = resolution
        self.published = published
        self.local_engine = local_engine
        self.user = user
        self.output_limit = output_limit
        self.default_timeout = default_timeout
        self.resolver_image = resolver_image
        self.labels = labels
        self.workdir = workdir
        self.runtime = runtime
        # Runtimes this environment has seen meet the namespace's rules (shared by its
        # sessions: bypassing netfilter is a property of the runtime, not of a sandbox).
        self.verified_runtimes = verified_runtimes
        self.executor: Executor = (
            ChannelExecutor(engine, sandbox, id)
            if exec_channel
            else PlainExecutor(functools.partial(run_exec, engine, sandbox, shell=programs.SHELL))
        )
        self.snapshot_lifetime_s = snapshot_lifetime_s
        #: where corral's resolver forwards the names an allowlist allows (and where corral
        #: resolves them at apply time)
        self.upstream = Upstream(
            tuple(ipaddress.ip_address(a) for a in upstream_dns_servers or ()) or None,
            resolver_image,
            labels,
        )
        #: the running services' containers, by name (`add_service`); a name of
        #: `services` missing here is a service whose container is gone
        self.service_containers: dict[str, Container] = {}
        #: what every policy of this session admits first (its credential proxy)
        self.endpoints = endpoints
        self.procs = ProcessClient(self._connect_procs, self._place_process, sandbox_id=id)
        self._defaults: Defaults | None = None

    def claimed_for(self, plan: ExecutionPlan) -> None:
        """Made ahead by the warm pool, now handed to an open of `plan`."""
        self.default_timeout = plan.timeouts.operation_s

    def add_service(self, name: str, info: dict[str, Any]) -> None:
        """`service=name` reaches the container the engine inspected as `info`."""
        workdir = info["Config"].get("WorkingDir") or "/"
        self.service_containers[name] = Container(info["Id"], workdir, name)
        if name not in self.services:
            self.services = (*self.services, name)

    def _container(self, service: str | None) -> Container:
        """The container `service` names (checked), the sandbox's for None."""
        name = self.service_name(service)
        if name is None:
            return Container(self.sandbox, self.workdir)
        found = self.service_containers.get(name)
        if found is None:
            raise ProviderError(f"sandbox {self.id}: the container of service {name!r} is gone")
        return found

    async def _process_manager(self, service: str | None) -> ProcessManager:
        if service is not None:
            raise FeatureUnsupported(
                f"background processes in a service (service={service!r}): a service runs "
                "none of corral's programs; use exec(..., service=...)"
            )
        return self.procs

    async def _connect_procs(self, token: EventLoopToken) -> ProcessLink:
        """A stream to the sandbox's process manager (started by the first one, from the
        programs volume, as root: it starts each process as its user)."""
        try:
            if self._defaults is None:
                self._defaults = await container_defaults(self.engine, self.sandbox)
            return await start_program(
                self.engine,
                self.sandbox,
                [programs.HELPER, "--procs", self.id],
                lambda transport: ProcessLink(
                    transport, token, "docker", self.engine.tokens, self.id
                ),
            )
        except ChannelUnavailable as exc:
            raise FeatureUnsupported(
                f"sandbox {self.id}: background processes need corral's process manager: {exc}"
            ) from None

    def _place_process(self, request: StartRequest) -> dict[str, Any]:
        defaults = self._defaults or Defaults("", "/", None)
        env = dict(request.env)
        if defaults.home is not None:
            env.setdefault("HOME", defaults.home)  # as an engine exec keeps the config's
        return {
            "argv": list(request.args),
            "cwd": self._absolute(request.cwd) if request.cwd is not None else self.workdir,
            "env": [f"{k}={v}" for k, v in env.items()],
            "user": request.user or self.user or defaults.user,
            "as_self": False,
        }

    async def _exec(self, request: ExecRequest) -> ExecResult:
        """In the sandbox through the exec channel or one engine exec per command
        (`helper.channel`), the configured user standing in for None; in a service, one
        engine exec per command as its own user. The cwd is made absolute either way."""
        if request.service is None:
            cwd = self._absolute(request.cwd) if request.cwd is not None else None
            return await self.executor.run(
                replace(request, cwd=cwd, user=request.user or self.user)
            )
        target = self._container(request.service)
        cwd = self._absolute(request.cwd, target) if request.cwd is not None else None
        try:
            return await run_exec(self.engine, target.id, replace(request, cwd=cwd))
        except ProviderError as exc:
            raise ProviderError(f"service {target.service!r} of sandbox {self.id}: {exc}") from None

    def _absolute(self, path: str, target: Container | None = None) -> str:
        workdir = self.workdir if target is None else target.workdir
        return posixpath.normpath(posixpath.join(workdir, path))

    async def _mkdir(self, path: str, target: Container) -> None:
        # corral's busybox in the sandbox; a service (no programs volume) has only its own
        tools = self._tools if target.service is None else ()
        result = await self.exec([*tools, "mkdir", "-p", path], service=target.service)
        if result.returncode != 0:
            raise ProviderError(
                f"cannot create {path!r} in {_where(target)}: {result.stderr.strip()}"
            )

    async def _put(self, target: Container, directory: str, chunks: Any) -> None:
        try:
            await self.engine.call(self.engine.api.put_archive, target.id, directory, chunks)
        except NotFound:
            raise RemotePathNotFound(directory) from None
        except APIError as exc:
            raise ProviderError(
                f"upload to {directory!r} in {_where(target)} failed: {exc.explanation}"
            ) from None

    async def _get(self, target: Container, path: str) -> Any:
        try:
            stream, _ = await self.engine.call(self.engine.api.get_archive, target.id, path)
        except NotFound:
            raise RemotePathNotFound(path) from None
        except APIError as exc:
            raise ProviderError(
                f"download of {path!r} from {_where(target)} failed: {exc.explanation}"
            ) from None
        return stream

    async def _upload_root(self, target: Container, path: str) -> str:
        """The real directory an upload to `path` lands in (see `landing`), created if missing."""
        files = SandboxFiles(self.engine, target.id)
        resolved = await files.resolve(path)
        if resolved is None:
            await self._mkdir(path, target)  # the container's mkdir: checked again after
            resolved = await files.resolve(path)
        if resolved is None:
            raise ProviderError(f"path {path!r} in {_where(target)} vanished while it was created")
        return resolved

    async def _upload(self, local: Path, remote: str, service: str | None) -> None:
        where = self._container(service)
        parent, name = posixpath.split(self._absolute(remote, where))
        await self._put(where, await self._upload_root(where, parent), pack_file(local, name))

    async def _download(
        self, remote: str, local: Path, service: str | None, max_bytes: int | None
    ) -> None:
        where = self._container(service)
        stream = await self._get(where, self._absolute(remote, where))
        try:
            # The size is the engine's tar header: the engine stats the file itself.
            await self.engine.call(extract_file, stream, local, remote, max_bytes)
        finally:
            # The engine holds the container's lock until the archive is read or closed:
            # left open (a refused or failed extraction), every later call hangs.
            stream.close()

    async def _upload_dir(self, local_dir: Path, remote_dir: str, service: str | None) -> None:
        where = self._container(service)
        target = self._absolute(remote_dir, where)
        await self.engine.call(validate_dir, local_dir)
        await self._put(where, await self._upload_root(where, target), pack_dir(local_dir))

    async def _download_dir(self, remote_dir: str, local_dir: Path, service: str | None) -> None:
        where = self._container(service)
        source = self._absolute(remote_dir, where)
        stream = await self._get(where, source)
        name = posixpath.basename(source.rstrip("/")) or "."
        try:
            await self.engine.call(lambda: extract_tar(stream, local_dir, strip=name))
        finally:
            stream.close()

    async def endpoint(self, port: int) -> str | None:
        if port in self.published:
            return f"http://127.0.0.1:{self.published[port]}"
        if self.local_engine and self.holder_address:
            return f"http://{self.holder_address}:{port}"
        return None

    async def host_gateway(self) -> str | None:
        return str(self.gateway)

    async def _end_workload(self) -> None:
        """Restart the sandbox container: its init dies, so the kernel kills its whole PID
        namespace, whatever the processes did to detach or hide. The filesystem stays.

        Shown gone through the engine's host-side view (`top`, container state), which
        nothing inside the container can change.

        The plan's services keep running: they are the task's infrastructure (the
        database the grader reads), not the workload. They stay under the holder's rules,
        so each switch covers them, but a process the agent got into a service (through
        the service's own interface) is not ended here (SECURITY.md, known gaps).
        """
        self.executor.reset()  # the exec channel's helper dies with the workload
        self.procs.reset()  # so do the process manager and every process it held
        try:
            before = set(await self._host_processes())
            old: dict[str, Any] = await self.engine.call(
                self.engine.api.inspect_container, self.sandbox
            )
            await self.engine.call(self.engine.api.restart, self.sandbox, timeout=RESTART_GRACE_S)
            new: dict[str, Any] = await self.engine.call(
                self.engine.api.inspect_container, self.sandbox
            )
            running = await self._host_processes()
        except APIError as exc:
            raise WorkloadNotStopped(
                f"sandbox {self.id}: restarting its container failed: {exc.explanation}"
            ) from None
        state = new["State"]
        survivors = before & set(running)
        if not state.get("Running") or state.get("Pid") == old["State"].get("Pid") or survivors:
            raise WorkloadNotStopped(
                f"sandbox {self.id}: processes {sorted(survivors)} outlived the restart"
                if survivors
                else f"sandbox {self.id}: the container did not come back after the restart"
            )
        # What runs now is what corral started: the engine's init and corral's idle main
        # process from the read-only programs volume (a plan.command is the workload's).
        if new.get("Path") == programs.BUSYBOX:
            foreign = {
                pid: command
                for pid, command in running.items()
                if command.split(" ", 1)[0] not in (ENGINE_INIT, programs.BUSYBOX)
            }
            if foreign:
                raise WorkloadNotStopped(
                    f"sandbox {self.id}: after the restart, processes corral did not start "
                    f"run: {sorted(foreign.values())}"
                )

    async def _host_processes(self) -> dict[str, str]:
        """The sandbox's processes by host pid, with their command lines (engine's view)."""
        top: dict[str, Any] = await self.engine.call(self.engine.api.top, self.sandbox)
        pid, command = top["Titles"].index("PID"), top["Titles"].index("CMD")
        rows: list[list[str]] = top.get("Processes") or []
        return {row[pid]: row[command] for row in rows}

    def network_events(self) -> NetworkEvents:
        if self.feed.unavailable is not None:
            raise FeatureUnsupported(
                f"sandbox {self.id}: network_events are unavailable: {self.feed.unavailable}"
            )
        return self.events.snapshot()

    async def _phase_changed(self) -> None:
        """The same rules again, stamped with the new phase: one restore (a denylist's is
        probed again; no other policy is)."""
        if self.resolution is None:
            return
        try:
            await apply_policy(
                self.engine,
                self.holder,
                self.policy,
                self.resolution,
                probe_candidates=[],
                phase=self.phase,
                events=self.events,
                endpoints=self.endpoints,
            )
        except ProviderError as exc:
            # The rules in force are whole (a failed restore keeps them); only the phase
            # their refusals are stamped with is stale.
            event(log, "warning", "relabelling events failed", sandbox=self.id, error=str(exc))

    async def _apply_network_policy(self, policy: NetworkPolicy) -> None:
        try:
            await self._apply(policy)
        except NetworkPolicyNotEnforced as exc:
            await self.fail_enforcement(str(exc))

    async def _save(self) -> SnapshotRef:
        """The sandbox container's files only: services are the plan's infrastructure, and
        a fork starts its own plan's services anew from their images."""
        return await snapshots.commit(
            self.engine,
            self.sandbox,
            self.labels[OWNER],
            self.id,
            self.snapshot_lifetime_s,
        )

    async def follow_names(self) -> None:
        """For a session found again: the policy's hostnames resolved now and, if it has
        any, the policy applied again, so its rules follow today's addresses."""
        if _has_hostnames(self.policy):
            await self._apply(self.policy)
        else:
            self.resolution = await self._resolve(self.policy)

    async def _refresh_names(self) -> float | None:
        if not _has_hostnames(self.policy):
            return None
        before = self.resolution
        resolved = await self._resolve(self.policy)
        if before is None or resolved.addresses != before.addresses:
            await self._apply(self.policy)
            event(log, "info", "names moved; policy applied again", sandbox=self.id)
        return resolved.ttl_s

    async def _resolve(self, policy: NetworkPolicy) -> Resolution:
        if uses_resolver(policy):
            # Asked of the upstream from the holder over corral's marked path, which works
            # whatever rules are in force (`enforcement.resolve`).
            return await self._resolve_from(policy, self.holder)
        if _has_hostnames(policy) and not needs_dns(self.policy):
            # DNS is closed in this namespace right now; ask the same network's resolver
            # from a fresh twin of corral's image instead.
            async with _resolver(self) as twin:
                return await self._resolve_from(policy, twin)
        return await self._resolve_from(policy, self.holder)

    async def _resolve_from(self, policy: NetworkPolicy, container: str) -> Resolution:
        return await resolve(
            self.engine,
            container,
            policy,
            dns=self.dns,
            extra_hosts=self.extra_hosts,
            upstream=self.upstream,
        )

    async def _apply(self, policy: NetworkPolicy) -> None:
        resolved = await self._resolve(policy)
        await apply_policy(
            self.engine,
            self.holder,
            policy,
            resolved,
            probe_candidates=[(self.gateway, DISCARD_PORT)],
            phase=self.phase,
            events=self.events,
            endpoints=self.endpoints,
        )
        self.resolution = resolved
        await self.check_runtime(policy)

    async def check_runtime(self, policy: NetworkPolicy) -> None:
        """Once per runtime, the first policy that forbids anything is probed from inside
        the sandbox container too (see `probe_from_sandbox`)."""
        if self.runtime in self.verified_runtimes or self.resolution is None:
            return
        probe = forbidden_probe(policy, self.resolution, [(self.gateway, DISCARD_PORT)])
        if probe is None:
            return
        await probe_from_sandbox(
            self.engine,
            self.holder,
            self.sandbox,
            probe,
            self.runtime,
            events=self.events,
        )
        self.verified_runtimes.add(self.runtime)


def _where(target: Container) -> str:
    return "the sandbox" if target.service is None else f"service {target.service!r}"


def _has_hostnames(policy: NetworkPolicy) -> bool:
    return any(t.entry_type is EntryType.HOSTNAME for t in policy.targets)


@asynccontextmanager
async def _resolver(session: DockerSession) -> AsyncGenerator[str]:
    """A short-lived container on the session's network, removed by exact name."""
    s = session
    name = f"corral-{s.id}-resolver-{secrets.token_hex(3)}"
    try:
        host_config = s.engine.api.create_host_config(
            network_mode=s.network,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            auto_remove=True,  # gone by itself after its `sleep`, should corral die
        )
        await s.engine.call(
            s.engine.api.create_container,
            s.resolver_image,
            ["sleep", "60"],
            name=name,
            labels=s.labels,
            host_config=host_config,
        )
        await s.engine.call(s.engine.api.start, name)
        yield name
    finally:
        with anyio.CancelScope(shield=True):
            await remove_container(s.engine, name, s.id)
