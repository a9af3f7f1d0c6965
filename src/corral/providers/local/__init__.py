"""The `local` provider: process trees on this host (not a filesystem security boundary)."""

from typing import TYPE_CHECKING

from corral.core.lazy import lazy_names
from corral.providers.local.config import LocalConfig

if TYPE_CHECKING:
    from corral.providers.local.environment import LocalEnvironment

__all__ = ["LocalConfig", "LocalEnvironment"]


__getattr__ = lazy_names(__name__, LocalEnvironment="corral.providers.local.environment")
