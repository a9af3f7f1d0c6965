"""corral's providers as a Harbor environment (extra `harbor`, Python >= 3.12).

`harbor run --env corral.adapters.harbor:CorralEnvironment --ek provider=docker ...`
selects it by import path. Without Harbor installed this module imports cleanly and
defines nothing: `UNAVAILABLE` says why, and `CorralEnvironment` raises ImportError.
"""

from typing import Any

from corral.adapters.harbor.config import HarborEnvironmentConfig


def _environment() -> tuple[type[Any] | None, str | None]:
    try:
        from corral.adapters.harbor.environment import CorralEnvironment
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("harbor"):
            raise
        return None, f"Harbor is not installed ({exc}); it needs Python >= 3.12"
    return CorralEnvironment, None


_DEFINED, UNAVAILABLE = _environment()


def __getattr__(name: str) -> Any:
    if name == "CorralEnvironment":
        if _DEFINED is None:
            raise ImportError(f"corral.adapters.harbor.CorralEnvironment: {UNAVAILABLE}")
        return _DEFINED
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# CorralEnvironment is served by __getattr__, so it exists only where Harbor is installed.
__all__ = ["UNAVAILABLE", "HarborEnvironmentConfig"]
