"""Network policy: the model, its normalization, and the renderers that enforce it."""

from corral.network.capabilities import NetworkCapabilities
from corral.network.iptables import IptablesPayload, render_iptables
from corral.network.netpol import render_network_policy
from corral.network.policy import PHASES, NetworkMode, NetworkPolicy, NetworkSchedule, Phase
from corral.network.resolve import Resolution, Resolver, address_rules, resolve_policy
from corral.network.targets import EntryType, NetworkTarget

__all__ = [
    "PHASES",
    "EntryType",
    "IptablesPayload",
    "NetworkCapabilities",
    "NetworkMode",
    "NetworkPolicy",
    "NetworkSchedule",
    "NetworkTarget",
    "Phase",
    "Resolution",
    "Resolver",
    "address_rules",
    "render_iptables",
    "render_network_policy",
    "resolve_policy",
]
