"""`CorralEnvironment`: a Harbor environment whose sandbox is a corral session.

Importing it needs Harbor (`contract.load()` raises ModuleNotFoundError without it):
`corral.adapters.harbor` imports it only on first use of `CorralEnvironment`.
A task's `environment/docker-compose.yaml` is read by `corral.compose` (its `main` service
is the sandbox, built as a single-container task's would be; the others are corral
services) where the provider has services; Harbor's per-service calls reach them.
Harbor constructs one per trial (and one per separate verifier environment): `__init__`
validates the kwargs, the provider config and every phase policy against what the
provider enforces (fail closed, before anything starts); `start()` opens the session
(corral's `open()` removes what it created when it fails, and anything failing after it
closes the session); `stop()` closes it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar, cast

import anyio
import yaml

from corral.adapters.harbor.config import HarborEnvironmentConfig
from corral.adapters.harbor.contract import load
from corral.adapters.harbor.mapping import (
    capability_flags,
    corral_policy,
    corral_schedule,
    ends_phase,
    exec_fields,
    gpu_capable,
    shell_command,
)
from corral.compose import plan_from_compose
from corral.core.environment import ENVIRONMENTS, BaseEnvironment
from corral.core.plan import ExecutionPlan, Resources, Timeouts
from corral.core.session import EnvironmentSession, Stream
from corral.network.policy import NetworkPolicy

log = logging.getLogger("corral.adapters.harbor")

#: Harbor's name for the agent's service (`harbor.constants.MAIN_SERVICE_NAME`).
MAIN_SERVICE = "main"
#: Keys Harbor's compose tasks put on `main` that the adapter provides itself.
HARBOR_KEYS = ("build",)

hb = load()

#: Providers by their (provider, provider_config), so trials share one engine client.
_providers: dict[str, BaseEnvironment] = {}


def provider(config: HarborEnvironmentConfig) -> BaseEnvironment:
    key = config.model_dump_json(include={"provider", "provider_config"})
    if key not in _providers:
        _providers[key] = ENVIRONMENTS.create(config.provider, **config.provider_params())
    return _providers[key]


class CorralEnvironment(hb.BaseEnvironment):
    """A corral provider behind Harbor's environment API; corral enforces the network."""

    options_model: ClassVar[type[HarborEnvironmentConfig]] = HarborEnvironmentConfig
    options: HarborEnvironmentConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._session: EnvironmentSession | None = None
        #: route name -> the URL the sandbox reaches it at (read once it started)
        self._route_urls: dict[str, str] = {}
        super().__init__(*args, **kwargs)  # pyright: ignore[reportUnknownMemberType]
        if self._host_mounts:
            raise ValueError(
                "corral environments take no Harbor mounts; give the provider its own "
                "(docker: provider_config mounts)"
            )
        if self.extra_docker_compose_paths:
            # Harbor lets a compose-capable environment take overlays; corral reads
            # only the task's own file, so an overlay would be silently dropped.
            raise ValueError(
                "corral environments take no --extra-docker-compose overlays "
                f"({', '.join(map(str, self.extra_docker_compose_paths))}); put the "
                "services in the task's environment/docker-compose.yaml"
            )
        if self.task_env_config.gpu_types:
            raise ValueError(
                f"corral cannot choose GPU types ({self.task_env_config.gpu_types}); "
                "use the provider's placement instead"
            )
        self._provider = provider(self.options)
        self._plan = self._provider.prepare(self._corral_plan())
        caps = self._provider.network_capabilities()
        for extra in self._phase_network_policies[2:]:  # later steps of a multi-step task
            caps.check_policy(corral_policy(extra), "run")
        phases = self._phase_network_policies
        self._first_phase: NetworkPolicy | None = corral_policy(phases[0]) if phases else None

    @staticmethod
    def type() -> str:
        return "corral"

    @property
    def capabilities(self) -> Any:
        provider_cls = self._provider_cls()
        return hb.EnvironmentCapabilities(
            **capability_flags(provider_cls),
            gpus=gpu_capable(provider_cls),
            mounted=False,
            docker_compose=provider_cls.supports_services,
            windows=False,
            stream=False,
        )

    @classmethod
    def resource_capabilities(cls) -> Any:
        # Both container providers apply cpu and memory as hard limits.
        return hb.EnvironmentResourceCapabilities(
            cpu_limit=True, memory_limit=True, fractional_cpus=True
        )

    @classmethod
    def preflight(cls, kwargs: dict[str, Any] | None = None) -> None:
        super().preflight(kwargs)  # pyright: ignore[reportUnknownMemberType]
        provider(HarborEnvironmentConfig.model_validate(kwargs or {}))

    def _validate_definition(self) -> None:
        env_dir = Path(self.environment_dir)
        compose = env_dir / "docker-compose.yaml"
        if compose.exists() and not self._provider_cls().supports_services:
            raise ValueError(
                f"{compose}: a multi-container task needs a corral provider with "
                f"services; {self.options.provider!r} has none"
            )
        if self.options.image or self.task_env_config.docker_image:
            return
        if not (env_dir / "Dockerfile").exists():
            raise FileNotFoundError(
                f"{env_dir} has no Dockerfile and the task sets no docker_image; "
                "give one, or the `image` kwarg"
            )
        if self.options.provider != "docker":
            raise ValueError(
                f"provider {self.options.provider!r} cannot build {env_dir / 'Dockerfile'}; "
                "set the task's docker_image or the `image` kwarg"
            )

    def _corral_plan(self) -> ExecutionPlan:
        cfg = self.task_env_config
        native = None
        if not self.options.image and not cfg.docker_image:
            native = {"build_context": str(self.environment_dir), "dockerfile": "Dockerfile"}
        limit = hb.ResourceMode.LIMIT
        plan = ExecutionPlan(
            image=self.options.image,
            native=native,
            task_image=cfg.docker_image,
            workdir=cfg.workdir,
            env=self.options.withheld(self._startup_env()) or {},
            resources=Resources(
                cpu=self._resource_limit_value("cpu", auto_mode=limit),
                memory_mb=self._resource_limit_value("memory", auto_mode=limit),
                disk_mb=cfg.storage_mb,
                gpus=cfg.gpus or None,
            ),
            timeouts=Timeouts(startup_s=self.options.startup_timeout_s),
            network=corral_schedule(self._network_policy, self._phase_network_policies),
            benchmark="harbor",
            task_id=self.environment_name,
            credentials=self.options.credentials,
        )
        compose = Path(self.environment_dir) / "docker-compose.yaml"
        return plan if not compose.exists() else compose_plan(compose, plan)

    def _provider_cls(self) -> type[BaseEnvironment]:
        return ENVIRONMENTS.get(self.options.provider)

    def _live(self) -> EnvironmentSession:
        if self._session is None or self._session.closed:
            raise RuntimeError(f"corral environment {self.session_id} is not started")
        return self._session

    async def start(self, force_build: bool) -> None:
        self._session = await self._provider.open(self._plan)
        log.info("harbor %s is corral session %s", self.session_id, self._session.id)
        try:
            self._route_urls = self.options.route_urls(self._session)
            await self._upload_environment_dir_after_start()
            await self.ensure_dirs(self._mount_targets(writable_only=True))
        except BaseException:
            await self._close()
            raise

    async def stop(self, delete: bool) -> None:
        # corral keeps nothing of a stopped sandbox, whatever `delete` says.
        await self._close()

    async def _close(self) -> None:
        session, self._session = self._session, None
        if session is None or session.environment is None:
            return
        with anyio.CancelScope(shield=True):
            await session.environment.close(session)

    async def _apply_network_policy(self, network_policy: Any) -> None:
        session = self._live()
        new = corral_policy(network_policy)
        if ends_phase(new, self._first_phase):
            await session.end_workload()
        await session.set_network_policy(new)

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> Any:
        return await self._exec_in(None, command, cwd, env, timeout_sec, user)

    async def service_exec(
        self,
        command: str,
        *,
        service: str | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> Any:
        return await self._exec_in(_sidecar(service), command, cwd, env, timeout_sec, user)

    async def service_download_file(
        self, source_path: str, target_path: Path | str, *, service: str | None = None
    ) -> None:
        await self._live().download(source_path, target_path, service=_sidecar(service))

    async def service_download_dir(
        self, source_dir: str, target_dir: Path | str, *, service: str | None = None
    ) -> None:
        await self._live().download_dir(source_dir, target_dir, service=_sidecar(service))

    async def stop_service(self, service: str) -> None:
        """The main service: every process the agent left is killed (the sandbox and
        its files stay for collection). A sidecar cannot be stopped alone."""
        if _sidecar(service) is None:
            await self._live().end_workload()
            return
        await super().stop_service(service)  # pyright: ignore[reportUnknownMemberType]

    async def _exec_in(
        self,
        service: str | None,
        command: str,
        cwd: str | None,
        env: dict[str, str] | None,
        timeout_sec: int | None,
        user: str | int | None,
    ) -> Any:
        callback = self._output_callback()

        async def relay(stream: Stream, text: str) -> None:
            await callback(text, stream)

        # The task's workdir, env and default user are the main service's; a sidecar
        # runs with its own, and only what the call gives.
        main = service is None
        who = self._resolve_user(user) if main else user
        result = await self._live().exec(
            shell_command(command),
            cwd=cwd or (self.task_env_config.workdir if main else None),
            env=self._routed(env) if main else env,
            user=None if who is None else str(who),
            timeout=timeout_sec,
            on_output=None if callback is None else relay,
            service=service,
        )
        return hb.ExecResult(**exec_fields(result, timeout_sec))

    def _routed(self, env: dict[str, str] | None) -> dict[str, str] | None:
        return self.options.routed(self._merge_env(env), self._route_urls)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        await self._live().upload(source_path, target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        await self._live().upload_dir(source_dir, target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        await self._live().download(source_path, target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        await self._live().download_dir(source_dir, target_dir)


def _sidecar(service: str | None) -> str | None:
    """corral's service for Harbor's name: Harbor's main service is the sandbox itself."""
    return None if service in (None, MAIN_SERVICE) else service


def compose_plan(path: Path, plan: ExecutionPlan) -> ExecutionPlan:
    """`plan` with the task's compose file read in: `main` is the sandbox, whose image the
    task's Dockerfile or docker_image gives (its `build` and Harbor's start order, which
    `open()` honours by waiting for every healthcheck, are Harbor's, not the plan's)."""
    loaded: object = yaml.safe_load(path.read_text(encoding="utf-8"))
    document = cast("dict[str, Any]", loaded) if isinstance(loaded, dict) else {}
    services = cast("dict[str, Any]", document.get("services") or {})
    main: object = services.get(MAIN_SERVICE) if isinstance(services, dict) else None  # pyright: ignore[reportUnnecessaryIsInstance]
    if not isinstance(main, dict):
        raise ValueError(f"{path}: a Harbor compose task needs a {MAIN_SERVICE!r} service")
    fields = cast("dict[str, Any]", main)
    services[MAIN_SERVICE] = {k: v for k, v in fields.items() if k not in HARBOR_KEYS}
    return plan_from_compose(document, main_service=MAIN_SERVICE, base=plan)
