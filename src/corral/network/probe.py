"""Choosing the probe: a destination the policy forbids, judged by the policy itself."""

from __future__ import annotations

import ipaddress

from corral.network.policy import NetworkMode, NetworkPolicy
from corral.network.resolve import Resolution, address_rules
from corral.network.targets import EntryType, IPAddress, IPNetwork

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
        denied = [
            (_a_host(rule.network), rule.port or DISCARD_PORT)
            for rule in address_rules(policy, resolved)
        ]
        options = denied + options
    return next((c for c in options if not allows(policy, resolved, *c)), None)


#: at most this many destinations a switch takes away are dialled around it
NARROWED_LIMIT = 4

#: the ports a name without one is tried on: those a named host most often answers on
_NAMED_PORTS = (443, 80)


def narrowed(
    previous: NetworkPolicy,
    previous_resolved: Resolution,
    policy: NetworkPolicy,
    resolved: Resolution,
) -> list[tuple[IPAddress, int]]:
    """Destinations the `previous` allowlist let through that `policy` forbids, at most
    NARROWED_LIMIT: each entry with a port, and a name without one on 443 and 80.

    A switch between two policies that both forbid the probe's candidates (an allowlist
    narrowed to no-network) is shown taken by a CNI only by one of these being refused:
    a destination refused before the switch too proves nothing. An address or network
    without a port names none known to answer, so it gives none (dialling a guess that
    drops would cost the dial's timeout). After a `public` or a denylist, the candidates
    themselves were allowed, so `forbidden_probe` suffices.
    """
    if previous.network_mode is not NetworkMode.ALLOWLIST:
        return []
    found: list[tuple[IPAddress, int]] = []
    for target in previous.targets:
        if target.entry_type is EntryType.HOSTNAME:
            hosts = previous_resolved.addresses.get(target.host, ())
            ports = (target.port,) if target.port else _NAMED_PORTS
        elif target.entry_type is EntryType.WILDCARD_HOSTNAME or target.port is None:
            continue
        else:
            hosts, ports = (_a_host(target.network()),), (target.port,)
        for host in hosts:
            for port in ports:
                if (host, port) not in found and not allows(policy, resolved, host, port):
                    found.append((host, port))
    return found[:NARROWED_LIMIT]


def _a_host(network: IPNetwork) -> IPAddress:
    """One address of `network` (not a /31's or wider's network address)."""
    if network.num_addresses > 2:
        return ipaddress.ip_address(next(iter(network.hosts())))
    return ipaddress.ip_address(network.network_address)
