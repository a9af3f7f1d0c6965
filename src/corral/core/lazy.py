"""A package's heavy names, imported on first use (PEP 562's module `__getattr__`): a
provider package hands out its config at once and its environment, with the SDK it
imports, only when asked for."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_names(package: str, **homes: str) -> Callable[[str], Any]:
    """A `__getattr__` for `package` serving each name in `homes` from its module."""

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(home), name)

    return __getattr__
