"""`CorralDeployment`: SWE-ReX's `AbstractDeployment` whose runtime runs in a corral
sandbox. `start()` opens a session of the configured provider and plan (a failed open
removes everything it created), `stop()` ends the runtime's bash sessions and closes the
session; both are idempotent."""

from __future__ import annotations

import logging
from typing import Any, Self

from swerex.deployment.abstract import AbstractDeployment
from swerex.deployment.hooks.abstract import CombinedDeploymentHook, DeploymentHook
from swerex.exceptions import DeploymentNotStartedError
from swerex.runtime.abstract import IsAliveResponse

from corral.adapters.provider import close_alone
from corral.adapters.swerex.config import CorralDeploymentConfig
from corral.adapters.swerex.runtime import CorralRuntime


class CorralDeployment(AbstractDeployment):
    def __init__(self, *, logger: logging.Logger | None = None, **kwargs: Any) -> None:
        """A deployment in a corral sandbox; kwargs as `CorralDeploymentConfig`."""
        # AbstractDeployment.__init__ sets nothing (SWE-ReX's own deployments skip it).
        self._config = CorralDeploymentConfig(**kwargs)
        self.logger = logger or logging.getLogger("corral.adapters.swerex")
        self._hooks = CombinedDeploymentHook()
        self._runtime: CorralRuntime | None = None

    @classmethod
    def from_config(cls, config: CorralDeploymentConfig) -> Self:
        return cls(**dict(config))

    def add_hook(self, hook: DeploymentHook) -> None:
        self._hooks.add_hook(hook)

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        """Whether the sandbox answers (test it with bool()).

        Raises:
            DeploymentNotStartedError: If the deployment was not started.
        """
        return await self.runtime.is_alive(timeout=timeout)

    async def start(self) -> None:
        """Open the sandbox; its runtime is ready when this returns."""
        if self._runtime is not None:
            return
        self._hooks.on_custom_step(f"Starting a corral sandbox ({self._config.provider})")
        environment = self._config.environment()
        session = await environment.open(self._config.plan)
        self._runtime = CorralRuntime(session, logger=self.logger)
        self.logger.info("corral sandbox %s is running", session.id)

    async def stop(self) -> None:
        """End the runtime's bash sessions and close the sandbox; idempotent."""
        runtime, self._runtime = self._runtime, None
        if runtime is None:
            return
        session = runtime.session
        try:
            await runtime.close()
        finally:
            await close_alone(session)

    @property
    def runtime(self) -> CorralRuntime:
        """The runtime while the deployment runs.

        Raises:
            DeploymentNotStartedError: If the deployment was not started.
        """
        if self._runtime is None:
            raise DeploymentNotStartedError()
        return self._runtime
