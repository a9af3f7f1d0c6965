"""The one module that reaches into AgentCompass (Python >= 3.12; no stubs, so `Any` here).

`load()` raises `ModuleNotFoundError` when AgentCompass is not installed.
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple


class Contract(NamedTuple):
    """The parts of AgentCompass's environment runtime that corral's adapter implements."""

    BaseEnvironment: Any
    EnvironmentSession: Any
    RuntimeEnvironmentConfig: Any
    config_field: Any
    EnvRecord: Any
    ExecResult: Any
    NetworkPolicy: Any
    NetworkMode: Any
    NetworkAllowlistEntryType: Any
    ResourceField: Any
    ENVIRONMENTS: Any


def load() -> Contract:
    base = importlib.import_module("agentcompass.runtime.base")
    config = importlib.import_module("agentcompass.runtime.config.component")
    models = importlib.import_module("agentcompass.runtime.models")
    network = importlib.import_module("agentcompass.runtime.network")
    resources = importlib.import_module("agentcompass.runtime.resources")
    registry = importlib.import_module("agentcompass.runtime.registry")
    return Contract(
        BaseEnvironment=base.BaseEnvironment,
        EnvironmentSession=base.EnvironmentSession,
        RuntimeEnvironmentConfig=config.RuntimeEnvironmentConfig,
        config_field=config.config_field,
        EnvRecord=base.EnvRecord,
        ExecResult=models.ExecResult,
        NetworkPolicy=network.NetworkPolicy,
        NetworkMode=network.NetworkMode,
        NetworkAllowlistEntryType=network.NetworkAllowlistEntryType,
        ResourceField=resources.ResourceField,
        ENVIRONMENTS=registry.ENVIRONMENTS,
    )
