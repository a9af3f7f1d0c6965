"""corral providers as AgentCompass environments: `corral-docker`, `corral-k8s`.

`define(contract, provider_id)` builds the AgentCompass classes on the contract it is
given: the real one from `contract.load()`, or a stand-in in the unit tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.adapters.agentcompass.contract import Contract
from corral.adapters.agentcompass.mapping import (
    RESOURCE_NAMES,
    corral_command,
    corral_policy,
    corral_resources,
    corral_schedule,
    exec_fields,
)
from corral.adapters.provider import close_alone
from corral.core.environment import ENVIRONMENTS
from corral.core.plan import ExecutionPlan, Timeouts
from corral.core.session import EnvironmentSession


def define(ac: Contract, provider_id: str) -> type[Any]:
    """The AgentCompass environment class `corral-<provider_id>`."""
    provider_cls = ENVIRONMENTS.get(provider_id)

    # AgentCompass's config_field returns a dataclasses.field (hence the RUF009 noqa).
    @dataclass(slots=True)
    class CorralConfig(ac.RuntimeEnvironmentConfig):
        image: str = ac.config_field(default="", description="sandbox image")
        workdir: str = ac.config_field(default="", description="working directory in the sandbox")
        env: dict[str, Any] = ac.config_field(  # noqa: RUF009
            default_factory=dict, description="environment variables of the sandbox"
        )
        startup_timeout_s: float = ac.config_field(
            default=120.0, description="seconds the sandbox may take to open"
        )
        resources: dict[str, Any] = ac.config_field(  # noqa: RUF009
            default_factory=dict, description="AgentCompass resource requirements"
        )
        provider_config: dict[str, Any] = ac.config_field(  # noqa: RUF009
            default_factory=dict,
            description=f"corral {provider_id!r} provider config (`corral config docs env "
            f"{provider_id}`)",
        )

    class CorralSession(ac.EnvironmentSession):
        def __init__(
            self, inner: EnvironmentSession, policy: Any, workdir: str, env_record: Any = None
        ) -> None:
            self.env_record = env_record
            self.inner = inner
            self.network_policy = policy
            self.default_workdir = workdir or None
            self.switches = 0

        async def exec(
            self,
            command: list[str] | str,
            *,
            shell: bool = False,
            cwd: str | None = None,
            env: dict[str, str] | None = None,
            required_env: dict[str, str] | None = None,
            timeout: float | None = None,
            detach: bool = False,
            flags: dict[str, Any] | None = None,
        ) -> Any:
            if flags:
                raise ValueError(f"corral environments take no exec flags, got {sorted(flags)}")
            checked = self._validate_exec_command(command, shell=shell)
            result = await self.inner.exec(
                corral_command(checked, detach=detach),
                cwd=await self.resolve_workdir(cwd),
                env=self._merge_exec_env(env, required_env=required_env),
                timeout=timeout,
            )
            return ac.ExecResult(**exec_fields(result))

        async def upload(self, src: str, dst: str) -> None:
            await self.inner.upload(src, await self.resolve_path(dst))

        async def download(self, src: str, dst: str) -> None:
            await self.inner.download(await self.resolve_path(src), dst)

        async def write_text(self, path: str, content: str) -> None:
            await self.inner.write_text(await self.resolve_path(path), content)

        async def read_text(self, path: str) -> str:
            return await self.inner.read_text(await self.resolve_path(path))

        async def upload_dir(self, src: Path | str, dst: str) -> None:
            await self.inner.upload_dir(src, await self.resolve_path(dst))

        async def download_dir(self, src: str, dst: Path | str) -> None:
            await self.inner.download_dir(await self.resolve_path(src), dst)

        async def endpoint(self) -> str | None:
            return None

        async def set_network_policy(self, policy: Any) -> None:
            resolved = ac.NetworkPolicy.from_value(policy)
            # AgentCompass switches baseline -> run first; every later call (run ->
            # evaluation, then back to the baseline) ends a phase, so what that phase
            # started is ended first, as TaskRun does, even when the policy stays the same.
            self.switches += 1
            if self.switches > 1:
                await self.inner.end_workload()
            if resolved == self.network_policy:
                return
            await self.inner.set_network_policy(corral_policy(resolved))
            self.network_policy = resolved

    class CorralEnvironment(ac.BaseEnvironment):
        """A corral provider, its network policy enforced by corral."""

        id = f"corral-{provider_id}"
        config_class = CorralConfig
        supported_network_modes = frozenset(
            ac.NetworkMode(m.value) for m in provider_cls.supported_network_modes
        )
        supported_allowlist_entry_types = frozenset(
            ac.NetworkAllowlistEntryType(t.value)
            for t in provider_cls.supported_allowlist_entry_types
        )
        supports_network_target_ports = provider_cls.supports_network_target_ports
        supports_dynamic_network_policy = provider_cls.supports_dynamic_network_policy
        supported_resource_fields = frozenset(ac.ResourceField(name) for name in RESOURCE_NAMES)
        supported_operating_systems = frozenset({"linux"})
        supports_task_env = True
        supports_startup_env = True
        setup_image_parameter = "image"
        setup_workdir_parameter = "workdir"
        setup_timeout_parameter = "startup_timeout_s"
        env_variables_param = "env"

        def __init__(self) -> None:
            super().__init__()  # pyright: ignore[reportUnknownMemberType]
            self.sessions: dict[str, EnvironmentSession] = {}

        async def open(self, req: Any, plan: Any) -> Any:
            config: Any = self.build_config(req, plan)
            baseline = self.resolve_network_policy(plan.environment.baseline_network_policy)
            corral_plan = ExecutionPlan(
                image=config.image or None,
                workdir=config.workdir or None,
                env={str(k): str(v) for k, v in config.env.items()},
                resources=corral_resources(config.resources),
                timeouts=Timeouts(startup_s=config.startup_timeout_s),
                network=corral_schedule(
                    baseline,
                    self.resolve_network_policy(plan.run_network_policy),
                    self.resolve_network_policy(plan.evaluation_network_policy),
                ),
                benchmark=req.benchmark.id,
                task_id=plan.task_id or None,
            )
            provider = ENVIRONMENTS.create(provider_id, **config.provider_config)
            inner = await provider.open(corral_plan)
            try:
                record = ac.EnvRecord.create(self, {"session_id": inner.id})
            except BaseException:
                await provider.close(inner)
                raise
            self.sessions[inner.id] = inner
            return CorralSession(inner, baseline, config.workdir, record)

        async def close(self, *, session_id: str) -> None:
            inner = self.sessions.pop(session_id, None)
            if inner is None or inner.environment is None:
                raise RuntimeError(
                    f"corral session {session_id} was not opened by this process; "
                    f"`corral gc --env {provider_id}` removes it once it expires"
                )
            await close_alone(inner)

    return CorralEnvironment
