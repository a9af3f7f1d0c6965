"""The `local` provider: process trees on this host (not a filesystem security boundary)."""

from typing import TYPE_CHECKING, Any

from corral.providers.local.config import LocalConfig

if TYPE_CHECKING:
    from corral.providers.local.environment import LocalEnvironment

__all__ = ["LocalConfig", "LocalEnvironment"]


def __getattr__(name: str) -> Any:
    # The environment (and its SDK) is imported on first use: the config alone is light.
    if name == "LocalEnvironment":
        from corral.providers.local.environment import LocalEnvironment

        return LocalEnvironment
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
