"""The built-in providers' configs as one typed family: `ProviderConfig` is any of them,
told apart by `type` (the provider's id), and `environment_for` builds its provider.

    config = provider_config({"type": "docker", "default_memory_mb": 512})
    env = environment_for(config)

Only the configs are imported here; each provider's SDK is imported when its environment
is first built.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, ValidationError

from corral.core.environment import ENVIRONMENTS, BaseEnvironment
from corral.errors import ConfigError
from corral.providers.docker.config import DockerConfig
from corral.providers.k8s.config import KubernetesConfig
from corral.providers.local.config import LocalConfig

ProviderConfig = Annotated[
    DockerConfig | KubernetesConfig | LocalConfig, Field(discriminator="type")
]

Config = DockerConfig | KubernetesConfig | LocalConfig
_BY_TYPE: dict[str, type[Config]] = {
    "docker": DockerConfig,
    "k8s": KubernetesConfig,
    "local": LocalConfig,
}


def provider_config(data: dict[str, Any]) -> Config:
    """The config `data` describes, by its `type`; ConfigError names what is wrong."""
    kind = data.get("type")
    chosen = _BY_TYPE.get(kind) if isinstance(kind, str) else None
    if chosen is None:
        raise ConfigError(f"provider config type {kind!r} is none of: {', '.join(_BY_TYPE)}")
    try:
        return chosen.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{kind} provider config: {exc}") from None


def environment_for(config: Config) -> BaseEnvironment:
    """The provider `config.type` names, built from `config`."""
    return ENVIRONMENTS.get(config.type)(config)
