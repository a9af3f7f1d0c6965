"""The `docker` provider: containers on a Docker Engine, egress enforced by a holder."""

from typing import TYPE_CHECKING, Any

from corral.providers.docker.config import DockerConfig

if TYPE_CHECKING:
    from corral.providers.docker.environment import DockerEnvironment

__all__ = ["DockerConfig", "DockerEnvironment"]


def __getattr__(name: str) -> Any:
    # The environment (and its SDK) is imported on first use: the config alone is light.
    if name == "DockerEnvironment":
        from corral.providers.docker.environment import DockerEnvironment

        return DockerEnvironment
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
