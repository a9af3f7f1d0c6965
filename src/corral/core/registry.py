"""The provider registry: built-ins plus the `corral.environments` entry-point group.

Providers are imported on first use, so a missing SDK (docker, kubernetes) only makes
that provider unavailable, with the reason recorded, instead of breaking `import corral`.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, NamedTuple

from corral.errors import ConfigError

if TYPE_CHECKING:
    from corral.core.environment import BaseEnvironment

ENTRY_POINT_GROUP = "corral.environments"

BUILTINS = {
    "local": "corral.providers.local:LocalEnvironment",
    "docker": "corral.providers.docker:DockerEnvironment",
    "k8s": "corral.providers.k8s:KubernetesEnvironment",
}


class ProviderStatus(NamedTuple):
    id: str
    provider: type[BaseEnvironment] | None
    reason: str | None


class EnvironmentRegistry:
    def __init__(self, base: type[BaseEnvironment]) -> None:
        self._base = base
        self._targets: dict[str, str] = {}
        self._loaded: dict[str, type[BaseEnvironment]] = {}
        self._errors: dict[str, str] = {}
        self._scanned = False

    def register(self, cls: type[BaseEnvironment]) -> type[BaseEnvironment]:
        """Register a provider class directly (also usable as a decorator)."""
        self._check(cls, getattr(cls, "id", None))
        self._loaded[cls.id] = cls
        self._errors.pop(cls.id, None)
        return cls

    def _scan(self) -> None:
        if self._scanned:
            return
        self._scanned = True
        self._targets.update(BUILTINS)
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            self._targets.setdefault(ep.name, ep.value)

    def ids(self) -> list[str]:
        self._scan()
        return sorted(set(self._targets) | set(self._loaded))

    def _installed(self) -> str:
        """The ids whose provider imports here: one whose SDK is missing is not offered."""
        return ", ".join(i for i in self.ids() if self.status(i).provider is not None)

    def status(self, env_id: str) -> ProviderStatus:
        try:
            return ProviderStatus(env_id, self.get(env_id), None)
        except ConfigError as exc:
            return ProviderStatus(env_id, None, str(exc))

    def get(self, env_id: str) -> type[BaseEnvironment]:
        self._scan()
        if env_id in self._loaded:
            return self._loaded[env_id]
        if env_id not in self._targets:
            raise ConfigError(f"unknown environment {env_id!r}; installed: {self._installed()}")
        if env_id in self._errors:
            raise ConfigError(self._errors[env_id])
        module_name, _, attr = self._targets[env_id].partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            self._errors[env_id] = (
                f"environment {env_id!r} is not installed: {exc} "
                f"(install the extra: pip install 'corral[{env_id}]')"
            )
            raise ConfigError(self._errors[env_id]) from None
        self._check(cls, env_id)
        self._loaded[env_id] = cls
        return cls

    def create(self, env_id: str, **params: Any) -> BaseEnvironment:
        """Build provider `env_id` from validated config parameters."""
        return self.get(env_id)(**params)

    def _check(self, cls: object, env_id: str | None) -> None:
        if not (isinstance(cls, type) and issubclass(cls, self._base)):
            raise ConfigError(f"environment {env_id!r} does not name a BaseEnvironment subclass")
        if cls.id != env_id:
            raise ConfigError(f"environment registered as {env_id!r} declares id {cls.id!r}")
