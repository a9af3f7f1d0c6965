"""The `local` provider: process trees on this host (not a filesystem security boundary)."""

from corral.providers.local.config import LocalConfig
from corral.providers.local.environment import LocalEnvironment

__all__ = ["LocalConfig", "LocalEnvironment"]
