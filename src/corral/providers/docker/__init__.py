"""The `docker` provider: containers on a Docker Engine, egress enforced by a holder."""

from typing import TYPE_CHECKING

from corral.core.lazy import lazy_names
from corral.providers.docker.config import DockerConfig

if TYPE_CHECKING:
    from corral.providers.docker.environment import DockerEnvironment

__all__ = ["DockerConfig", "DockerEnvironment"]


__getattr__ = lazy_names(__name__, DockerEnvironment="corral.providers.docker.environment")
