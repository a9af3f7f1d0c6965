"""The one module that reaches into Harbor (Python >= 3.12; no stubs, so `Any` here).

`load()` raises `ModuleNotFoundError` when Harbor is not installed.
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple


class Contract(NamedTuple):
    """The parts of Harbor's environment API that corral's adapter implements."""

    BaseEnvironment: Any
    ExecResult: Any
    EnvironmentCapabilities: Any
    EnvironmentResourceCapabilities: Any
    ResourceMode: Any
    TaskOS: Any


def load() -> Contract:
    base = importlib.import_module("harbor.environments.base")
    capabilities = importlib.import_module("harbor.environments.capabilities")
    task = importlib.import_module("harbor.models.task.config")
    trial = importlib.import_module("harbor.models.trial.config")
    return Contract(
        BaseEnvironment=base.BaseEnvironment,
        ExecResult=base.ExecResult,
        EnvironmentCapabilities=capabilities.EnvironmentCapabilities,
        EnvironmentResourceCapabilities=capabilities.EnvironmentResourceCapabilities,
        ResourceMode=trial.ResourceMode,
        TaskOS=task.TaskOS,
    )
