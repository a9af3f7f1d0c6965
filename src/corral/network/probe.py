"""Choosing the probe: a destination the policy forbids, judged by the policy itself."""

from __future__ import annotations

import ipaddress

from corral.network.policy import NetworkMode, NetworkPolicy
from corral.network.resolve import Resolution, address_rules
from corral.network.targets import IPAddress

DISCARD_PORT = 9


def allows(policy: NetworkPolicy, resolved: Resolution, address: IPAddress, port: int) -> bool:
    """Whether `policy` lets a TCP connection to `address:port` through."""
    mode = policy.network_mode
    if mode is NetworkMode.PUBLIC:
        return True
    if mode is NetworkMode.NO_NETWORK:
        return False
    hit = any(
        address in rule.network and rule.port in (None, port)
        for rule in address_rules(policy, resolved, skip_wildcards=True)
    )
    return hit if mode is NetworkMode.ALLOWLIST else not hit


def forbidden_probe(
    policy: NetworkPolicy, resolved: Resolution, candidates: list[tuple[IPAddress, int]]
) -> tuple[IPAddress, int] | None:
    """The first destination the policy must refuse: denied targets first, then candidates.

    None for `public`, which forbids nothing.
    """
    if policy.network_mode is NetworkMode.PUBLIC:
        return None
    options = list(candidates)
    if policy.network_mode is NetworkMode.DENYLIST:
        denied: list[tuple[IPAddress, int]] = []
        for rule in address_rules(policy, resolved):
            host = rule.network.network_address
            if rule.network.num_addresses > 2:
                host = next(iter(rule.network.hosts()))
            denied.append((ipaddress.ip_address(host), rule.port or DISCARD_PORT))
        options = denied + options
    return next((c for c in options if not allows(policy, resolved, *c)), None)
