"""Registering corral's providers in AgentCompass's environment registry."""

from __future__ import annotations

from corral.adapters.agentcompass.contract import Contract
from corral.adapters.agentcompass.environment import define
from corral.core.environment import ENVIRONMENTS

#: corral providers offered to AgentCompass, as `corral-<id>`.
PROVIDERS = ("docker", "k8s")


def register(ac: Contract) -> list[str]:
    """Register every provider in PROVIDERS whose SDK is installed; returns their ids."""
    registered: list[str] = []
    for provider_id in PROVIDERS:
        if ENVIRONMENTS.status(provider_id).provider is None:
            continue
        name = f"corral-{provider_id}"
        if name not in ac.ENVIRONMENTS.names():
            ac.ENVIRONMENTS.register()(define(ac, provider_id))
        registered.append(name)
    return registered
