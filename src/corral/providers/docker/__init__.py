"""The `docker` provider: containers on a Docker Engine, egress enforced by a holder."""

from corral.providers.docker.config import DockerConfig
from corral.providers.docker.environment import DockerEnvironment

__all__ = ["DockerConfig", "DockerEnvironment"]
