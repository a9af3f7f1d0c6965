"""`CorralSandboxEnvironment`: one corral session per Inspect sample.

`sample_init` opens the session (corral's `open()` removes everything it created when it
fails, so a failed init, which Inspect does not clean up, leaks nothing) and binds the
config's workspaces; `sample_cleanup` finalizes them (an interrupted sample's are
abandoned: nothing is synced back) and closes the session; `task_cleanup` closes any
session of the task still open and runs the provider's gc; `cli_cleanup` runs gc on every
provider that answers.

Inspect has no phase hooks, so the plan's `baseline` policy is in force from the start;
a solver or scorer switches with `await sandbox().as_type(CorralSandboxEnvironment)
.set_phase("run")`.

The plan's services are named sandboxes beside `default` (`sandbox("db")`): views of the
same session, under the same policy, whose calls run in that service. A compose file given
as the config (`sandbox=("corral", "compose.yaml")`) is read by `corral.compose`.
"""

from __future__ import annotations

import logging
from typing import Any, Literal, overload

from inspect_ai.util import (
    ExecRemoteAwaitableOptions,
    ExecRemoteProcess,
    ExecRemoteStreamingOptions,
    ExecResult,
    SandboxConnection,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
    sandboxenv,
)
from pydantic import BaseModel
from typing_extensions import override

from corral.adapters.credential_env import RoutedEnv
from corral.adapters.inspect.config import DEFAULT_OWNER, CorralSandboxConfig, load_config
from corral.adapters.inspect.connection import connection
from corral.adapters.inspect.files import read_file, write_file
from corral.adapters.inspect.remote import run, start
from corral.adapters.inspect.results import to_inspect
from corral.core.bindings import BoundSet
from corral.core.environment import ENVIRONMENTS, BaseEnvironment
from corral.core.logs import event
from corral.core.session import EnvironmentSession
from corral.errors import CorralError, ExecUserRefused, ExecUserUnsupported, ProviderError
from corral.network.policy import NetworkSchedule, Phase
from corral.workspace.options import binding_from

log = logging.getLogger("corral.adapters.inspect")

#: Providers by their (provider, provider_config), so samples share one engine client.
_providers: dict[str, BaseEnvironment] = {}
#: Sessions still open, by task name, for `task_cleanup`.
_open: dict[str, dict[str, EnvironmentSession]] = {}
#: Workspaces bound to a session and not yet finalized, by session id.
_bound: dict[str, BoundSet] = {}


def provider(config: CorralSandboxConfig) -> BaseEnvironment:
    key = config.model_dump_json(include={"provider", "provider_config"})
    if key not in _providers:
        _providers[key] = config.environment()
    return _providers[key]


async def _close(task_name: str, session: EnvironmentSession) -> None:
    _open.get(task_name, {}).pop(session.id, None)
    left = _bound.pop(session.id, None)
    if left is not None:
        left.abandon()
    if session.environment is not None:
        await session.environment.close(session)


@sandboxenv(name="corral")  # pyright: ignore[reportUntypedClassDecorator]
class CorralSandboxEnvironment(SandboxEnvironment):
    """A corral session seen through Inspect's `SandboxEnvironment` contract."""

    def __init__(
        self,
        session: EnvironmentSession,
        schedule: NetworkSchedule,
        service: str | None = None,
        routing: RoutedEnv | None = None,
    ) -> None:
        super().__init__()
        self.session = session
        self.schedule = schedule
        #: the plan's service this sandbox is (None: the sandbox itself, `default`)
        self.service = service
        #: the agent's keys withheld from every command, its base URLs routed (the sandbox
        #: itself only: services are the task's infrastructure)
        self.routing = routing or RoutedEnv()
        self._route_urls = self.routing.route_urls(session)

    def command_env(self, env: dict[str, str] | None) -> dict[str, str] | None:
        """What a command of this sandbox gets for the harness's `env`."""
        return self.routing.routed(env, self._route_urls)

    async def set_phase(self, phase: Phase) -> None:
        """Apply the plan's policy for `phase` (only where the provider can switch).

        As with `TaskRun`, every phase but `run` starts in a clean process table: what the
        agent left running never lives on under the grader's policy.
        """
        if phase != "run":
            await self.session.end_workload()
        await self.session.set_network_policy(self.schedule.policy(phase), phase=phase)

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return CorralSandboxConfig.model_validate(config)

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        cfg = load_config(config)
        if "default" in cfg.plan.services:
            raise ValueError(
                "a corral service cannot be named 'default': Inspect's default sandbox is the "
                "plan's own"
            )
        provider(cfg).prepare(cfg.plan)  # provider config, recipes and schedule, checked once

    @classmethod
    async def sample_init(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        metadata: dict[str, str],
    ) -> dict[str, SandboxEnvironment]:
        cfg = load_config(config)
        session = await provider(cfg).open(cfg.plan)
        _open.setdefault(task_name, {})[session.id] = session
        bound = BoundSet([binding_from(options) for options in cfg.bindings])
        try:
            await bound.bind(session)
        except BaseException:
            await _close(task_name, session)
            raise
        _bound[session.id] = bound
        try:
            default = cls(session, cfg.plan.network, routing=cfg)
        except BaseException:
            await _close(task_name, session)
            raise
        services = {name: cls(session, cfg.plan.network, name) for name in session.services}
        return {"default": default, **services}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for environment in environments.values():
            session = environment.as_type(cls).session
            try:
                bound = _bound.pop(session.id, None)
                if bound is not None and interrupted:
                    bound.abandon()
                elif bound is not None:
                    for snapshot in await bound.finalize("completed"):
                        event(
                            log,
                            "info",
                            "workspace finalized",
                            sandbox=session.id,
                            snapshot=snapshot,
                        )
            finally:
                await _close(task_name, session)

    @classmethod
    async def task_cleanup(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool
    ) -> None:
        if not cleanup:
            return
        for session in list(_open.get(task_name, {}).values()):
            await _close(task_name, session)
        _open.pop(task_name, None)
        removed = await provider(load_config(config)).gc()
        if removed:
            log.info("gc after task %s removed %s", task_name, ", ".join(removed))

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """`inspect sandbox cleanup corral [OWNER]`: expired resources of that owner, on
        every installed provider; one that is not configured or does not answer (no
        kubeconfig, no `corral` namespace, no engine) is skipped with a line saying why."""
        for env_id in ENVIRONMENTS.ids():
            status = ENVIRONMENTS.status(env_id)
            if status.provider is None:
                continue
            if not status.provider.engine_answers():
                print(f"{env_id}: skipped, its engine does not answer")
                continue
            try:
                removed = await ENVIRONMENTS.create(env_id, owner=id or DEFAULT_OWNER).gc()
            except CorralError as exc:
                print(f"{env_id}: skipped, {exc}")
                continue
            for item in removed:
                print(f"{env_id}: removed {item}")

    @override
    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        try:
            result = await self.session.exec(
                cmd,
                cwd=cwd,
                env=self.command_env(env),
                user=user,
                timeout=timeout,
                stdin=input,
                service=self.service,
            )
        except (ExecUserUnsupported, ExecUserRefused) as exc:
            # What Inspect's own sandboxes raise for a user they cannot run as.
            raise SandboxUserUnsupportedError(str(exc)) from exc
        except ProviderError as exc:
            raise SandboxUnavailableError(str(exc)) from exc
        return to_inspect(result, cmd, timeout)

    @overload
    async def exec_remote(
        self,
        cmd: list[str],
        options: ExecRemoteStreamingOptions | None = None,
        *,
        stream: Literal[True] = True,
    ) -> ExecRemoteProcess: ...

    @overload
    async def exec_remote(
        self,
        cmd: list[str],
        options: ExecRemoteAwaitableOptions | None = None,
        *,
        stream: Literal[False],
    ) -> ExecResult[str]: ...

    @override
    async def exec_remote(
        self,
        cmd: list[str],
        options: ExecRemoteStreamingOptions | ExecRemoteAwaitableOptions | None = None,
        *,
        stream: bool = True,
    ) -> ExecRemoteProcess | ExecResult[str]:
        """Inspect's `exec_remote` on a corral process (`corral.adapters.inspect.remote`):
        no tools injected, no polling. Reached on this object (`sandbox().as_type(
        CorralSandboxEnvironment)`): Inspect's `sandbox()` proxy runs Inspect's own
        implementation, through `exec`, which is also what a service has (it runs no
        corral helper)."""
        if self.service is not None:
            raise SandboxUnavailableError(
                f"corral service {self.service!r} runs no process manager: call "
                f"sandbox({self.service!r}).exec_remote(...) itself (Inspect's own "
                "implementation, through exec)"
            )
        if stream:
            return await start(self, cmd, options)
        return await run(self, cmd, options)

    @override
    async def write_file(self, file: str, contents: str | bytes) -> None:
        await write_file(self.session, file, contents, service=self.service)

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    @override
    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        data = await read_file(self.session, file, service=self.service)
        return data.decode("utf-8") if text else data

    @override
    async def connection(self, *, user: str | None = None) -> SandboxConnection:
        if self.service is not None:
            raise NotImplementedError(
                f"corral offers no attach command for service {self.service!r}"
            )
        return connection(self.session, user)
