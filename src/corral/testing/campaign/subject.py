"""What the campaign runs against."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from corral.core.environment import BaseEnvironment
from corral.core.plan import ExecutionPlan
from corral.network.policy import NetworkPolicy
from corral.testing.plugin import ConnectCommand, EgressTarget


@dataclass(frozen=True)
class Subject:
    """What the campaign runs against: a provider and the means to see what it left."""

    provider: str
    env: BaseEnvironment
    plan: ExecutionPlan
    """Its baseline must be `switch[0]`."""
    owned: Callable[[], frozenset[str]]
    """Names of the provider objects carrying the run's owner label (Docker containers and
    networks, Pods, NetworkPolicies), a blocking call; a provider that makes none returns
    an empty set. Also called when each cancellation is requested (`Attempt.present`)."""
    targets: tuple[EgressTarget, EgressTarget]
    """Two host listeners the sandbox reaches under `public`."""
    switch: tuple[NetworkPolicy, NetworkPolicy]
    """`set_network_policy` switches from the first to the second."""
    connect: ConnectCommand
    scratch: Path
    """An empty host directory of the campaign's own."""
    max_n: int | None = None
    """Stop at this N even if the operation did not complete (a bounded run)."""
