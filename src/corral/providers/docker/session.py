"""A `docker` sandbox: the sandbox container, the holder that owns its network, and the
plan's services in that network (`services`)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from anyio.lowlevel import EventLoopToken
from docker.errors import APIError

from corral.core.labels import OWNER
from corral.core.logs import event
from corral.core.plan import ExecutionPlan
from corral.core.processes import ProcessManager, StartRequest
from corral.core.session import EnvironmentSession, ExecRequest, ExecResult
from corral.core.snapshot import SnapshotRef
from corral.errors import (
    FeatureUnsupported,
    NetworkPolicyNotEnforced,
    ProviderError,
    WorkloadNotStopped,
)
from corral.helper.channel import Executor, PlainExecutor
from corral.helper.link import ChannelUnavailable
from corral.helper.procs import ProcessClient, ProcessLink
from corral.network.events import NetworkEvents
from corral.network.policy import NetworkPolicy, Phase
from corral.providers.docker import gateway, programs, snapshots
from corral.providers.docker.channel import (
    ChannelExecutor,
    Defaults,
    container_defaults,
    start_program,
)
from corral.providers.docker.engine import Engine
from corral.providers.docker.events import EventFeed
from corral.providers.docker.execution import run_exec
from corral.providers.docker.files import Container, ContainerFiles
from corral.providers.docker.holder_net import HolderNet
from corral.providers.docker.own_kernel import OWN_KERNEL

log = logging.getLogger("corral.docker")

#: Seconds the sandbox's init gets to end on SIGTERM in `end_workload` before the engine
#: kills it. It ends at once (the engine's init, whose only child is corral's busybox idling,
#: and no workload can make either ignore SIGTERM), so this is paid only with a
#: `plan.command` that ignores it.
RESTART_GRACE_S = 10
#: the engine's init (`init=True`), bind-mounted read-only from the engine's host
ENGINE_INIT = "/sbin/docker-init"


class DockerSession(EnvironmentSession):
    _tools = (programs.BUSYBOX,)

    def __init__(
        self,
        *,
        id: str,
        policy: NetworkPolicy,
        engine: Engine,
        net: HolderNet,
        sandbox: str,
        user: str | None,
        output_limit: int,
        default_timeout: float | None,
        labels: dict[str, str],
        workdir: str,
        exec_channel: bool,
        snapshot_lifetime_s: float,
        phase: Phase | None,
        events: EventFeed,
        credential_env: Mapping[str, str] | None = None,
        image: str = "",
        services: tuple[str, ...] = (),
    ) -> None:
        super().__init__(
            id=id, policy=policy, image=image, services=services, credential_env=credential_env
        )
        self.phase = phase
        #: refused attempts, fed by the reader in the holder (`providers.docker.events`)
        self.feed = events
        self.engine = engine
        #: the holder's namespace and the policy it enforces (`holder_net`)
        self.net = net
        self.sandbox = sandbox
        self.user = user
        self.output_limit = output_limit
        self.default_timeout = default_timeout
        self.labels = labels
        self.workdir = workdir
        self.executor: Executor = (
            ChannelExecutor(engine, sandbox, id)
            if exec_channel
            else PlainExecutor(functools.partial(run_exec, engine, sandbox, shell=programs.SHELL))
        )
        self.snapshot_lifetime_s = snapshot_lifetime_s
        #: the running services' containers, by name (`add_service`); a name of
        #: `services` missing here is a service whose container is gone
        self.service_containers: dict[str, Container] = {}
        self.procs = ProcessClient(self._connect_procs, self._place_process, sandbox_id=id)
        self.files = ContainerFiles(engine, self._mkdir)
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
            "cwd": self._container(None).absolute(request.cwd or "."),
            "env": [f"{k}={v}" for k, v in env.items()],
            "user": request.user or self.user or defaults.user,
            "as_self": False,
        }

    async def _exec(self, request: ExecRequest) -> ExecResult:
        """In the sandbox through the exec channel or one engine exec per command
        (`helper.channel`), the configured user standing in for None; in a service, one
        engine exec per command as its own user. The cwd is made absolute either way."""
        if request.service is None:
            cwd = self._container(None).absolute(request.cwd) if request.cwd is not None else None
            return await self.executor.run(
                replace(request, cwd=cwd, user=request.user or self.user)
            )
        target = self._container(request.service)
        cwd = target.absolute(request.cwd) if request.cwd is not None else None
        try:
            return await run_exec(self.engine, target.id, replace(request, cwd=cwd))
        except ProviderError as exc:
            raise ProviderError(f"service {target.service!r} of sandbox {self.id}: {exc}") from None

    async def _mkdir(self, path: str, target: Container) -> None:
        # corral's busybox in the sandbox; a service (no programs volume) has only its own
        tools = self._tools if target.service is None else ()
        result = await self.exec([*tools, "mkdir", "-p", path], service=target.service)
        if result.returncode != 0:
            raise ProviderError(
                f"cannot create {path!r} in {target.where()}: {result.stderr.strip()}"
            )

    async def _upload(self, local: Path, remote: str, service: str | None) -> None:
        await self.files.upload(local, self._container(service), remote)

    async def _download(
        self, remote: str, local: Path, service: str | None, max_bytes: int | None
    ) -> None:
        await self.files.download(self._container(service), remote, local, max_bytes)

    async def _upload_dir(self, local_dir: Path, remote_dir: str, service: str | None) -> None:
        await self.files.upload_dir(local_dir, self._container(service), remote_dir)

    async def _download_dir(self, remote_dir: str, local_dir: Path, service: str | None) -> None:
        await self.files.download_dir(self._container(service), remote_dir, local_dir)

    async def endpoint(self, port: int) -> str | None:
        return self.net.endpoint(port)

    async def host_gateway(self) -> str | None:
        return str(self.net.gateway)

    async def _end_workload(self) -> None:
        """Restart the sandbox container: its init dies, so the kernel kills its whole PID
        namespace, whatever the processes did to detach or hide. The filesystem stays.

        Shown gone through the engine's host-side view (`top`, container state), which
        nothing inside the container can change. Under a runtime with a kernel of its own
        (gVisor) `top` does not list the sandbox's processes: there the proof is the new
        sandbox process (`State.Pid`), a new kernel, since nothing outlives its kernel.

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
            if self.net.link_owner is None:
                await self.engine.call(
                    self.engine.api.restart, self.sandbox, timeout=RESTART_GRACE_S
                )
            else:
                await self.engine.call(self.engine.api.stop, self.sandbox, timeout=RESTART_GRACE_S)
                await gateway.address(self.engine, self.net.link_owner)
                await self.engine.call(self.engine.api.start, self.sandbox)
            new: dict[str, Any] = await self.engine.call(
                self.engine.api.inspect_container, self.sandbox
            )
            running = await self._host_processes()
        except APIError as exc:
            raise WorkloadNotStopped(
                f"sandbox {self.id}: restarting its container failed: {exc.explanation}"
            ) from None
        state = new["State"]
        own_kernel = self.net.runtime in OWN_KERNEL
        survivors = set[str]() if own_kernel else before & set(running)
        if not state.get("Running") or state.get("Pid") == old["State"].get("Pid") or survivors:
            raise WorkloadNotStopped(
                f"sandbox {self.id}: processes {sorted(survivors)} outlived the restart"
                if survivors
                else f"sandbox {self.id}: the container did not come back after the restart"
            )
        # What runs now is what corral started: the engine's init and corral's idle main
        # process from the read-only programs volume (a plan.command is the workload's).
        if new.get("Path") == programs.BUSYBOX and not own_kernel:
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
        return self.net.events.snapshot()

    async def _phase_changed(self) -> None:
        try:
            await self.net.restamp(self.policy, self.phase)
        except ProviderError as exc:
            # The rules in force are whole (a failed restore keeps them); only the phase
            # their refusals are stamped with is stale.
            event(log, "warning", "relabelling events failed", sandbox=self.id, error=str(exc))

    async def _apply_network_policy(self, policy: NetworkPolicy) -> None:
        try:
            await self.net.apply(policy, in_force=self.policy, phase=self.phase)
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
        """For a session found again: its rules follow today's addresses (`HolderNet.follow`)."""
        await self.net.follow(self.policy, self.phase)

    async def _refresh_names(self) -> float | None:
        return await self.net.refresh(self.policy, self.phase)
