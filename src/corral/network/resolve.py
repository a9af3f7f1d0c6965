"""Hostname resolution at apply time, and the expansion of a policy into address rules."""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, field_validator

from corral.errors import NetworkPolicyUnsupported
from corral.network.addresses import IPAddress, IPNetwork, canonical_address
from corral.network.policy import NetworkMode, NetworkPolicy
from corral.network.targets import EntryType
from corral.network.wildcard import NameSets

Resolver = Callable[[str], Awaitable[Sequence[IPAddress]]]

#: Run inside the sandbox as `sh -c GETENT_SCRIPT sh host...`: resolves the way its
#: processes do (nsswitch: /etc/hosts, then its DNS resolver).
GETENT_SCRIPT = (
    'for h in "$@"; do getent ahosts "$h" | while read -r a rest; do echo "$h $a"; done; done; true'
)


def parse_resolv_conf(text: str) -> tuple[IPAddress, ...]:
    """The nameservers of a resolv.conf: the sandbox's resolvers."""
    servers: list[IPAddress] = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            try:
                servers.append(ipaddress.ip_address(parts[1].split("%")[0]))
            except ValueError:
                continue
    return tuple(servers)


def parse_getent(output: str) -> dict[str, list[IPAddress]]:
    found: dict[str, list[IPAddress]] = {}
    for line in output.splitlines():
        host, _, address = line.partition(" ")
        try:
            found.setdefault(host, []).append(ipaddress.ip_address(address.strip()))
        except ValueError:
            continue
    return found


class Resolution(BaseModel):
    """Addresses of a policy's hostnames, as the sandbox resolved them, and its resolvers.

    The sandbox answers these, so each address is folded to what the kernel will see (no
    zone id; v4-mapped as IPv4).
    """

    model_config = ConfigDict(frozen=True)

    addresses: dict[str, tuple[IPAddress, ...]] = {}
    dns_servers: tuple[IPAddress, ...] = ()
    #: seconds until the first of those answers expires (None: no hostname was resolved)
    ttl_s: float | None = None
    #: an allowlist that names hosts (`network.wildcard.uses_resolver`): the sets and
    #: resolver configuration of this apply
    names: NameSets | None = None

    @field_validator("addresses", mode="after")
    @classmethod
    def _canonical_addresses(
        cls, value: dict[str, tuple[IPAddress, ...]]
    ) -> dict[str, tuple[IPAddress, ...]]:
        return {host: _canonical(found) for host, found in value.items()}

    @field_validator("dns_servers", mode="after")
    @classmethod
    def _canonical_servers(cls, value: tuple[IPAddress, ...]) -> tuple[IPAddress, ...]:
        return _canonical(value)


def _canonical(addresses: tuple[IPAddress, ...]) -> tuple[IPAddress, ...]:
    return tuple(dict.fromkeys(canonical_address(a) for a in addresses))


class AddressRule(NamedTuple):
    network: IPNetwork
    port: int | None


async def resolve_policy(
    policy: NetworkPolicy, resolver: Resolver, dns_servers: Iterable[IPAddress] = ()
) -> Resolution:
    """Resolve every hostname of `policy` with `resolver` (run inside the sandbox).

    A denylist hostname that does not resolve is an error: corral cannot block what it
    cannot name. An allowlist hostname that does not resolve simply allows nothing.
    """
    addresses: dict[str, tuple[IPAddress, ...]] = {}
    for target in policy.targets:
        if target.entry_type is not EntryType.HOSTNAME or target.host in addresses:
            continue
        found = tuple(dict.fromkeys(await resolver(target.host)))
        if not found and policy.network_mode is NetworkMode.DENYLIST:
            raise NetworkPolicyUnsupported(
                f"denied host {target.host!r} does not resolve inside the sandbox, so it "
                "cannot be blocked by address; list its addresses or CIDR instead"
            )
        addresses[target.host] = found
    return Resolution(addresses=addresses, dns_servers=tuple(dns_servers))


def address_rules(
    policy: NetworkPolicy, resolved: Resolution, *, skip_wildcards: bool = False
) -> list[AddressRule]:
    """The policy's targets as (network, port) pairs, hostnames replaced by their addresses.

    A wildcard has no addresses: it is an error unless `skip_wildcards` (a renderer that
    enforces them through corral's resolver and its sets, `network.wildcard`)."""
    rules: list[AddressRule] = []
    for target in policy.targets:
        if target.entry_type is EntryType.WILDCARD_HOSTNAME:
            if skip_wildcards and policy.network_mode is NetworkMode.ALLOWLIST:
                continue
            raise NetworkPolicyUnsupported(
                f"wildcard entry {str(target)!r} cannot be expanded to addresses"
            )
        if target.entry_type is EntryType.HOSTNAME:
            if target.host not in resolved.addresses:
                raise ValueError(f"hostname {target.host!r} was not resolved before rendering")
            networks = [ipaddress.ip_network(a) for a in resolved.addresses[target.host]]
        else:
            networks = [target.network()]
        rules.extend(AddressRule(n, target.port) for n in networks)
    return list(dict.fromkeys(rules))


def hostnames(policy: NetworkPolicy) -> list[str]:
    """The hostnames among the policy's targets, which resolve to addresses at apply time."""
    return [t.host for t in policy.targets if t.entry_type is EntryType.HOSTNAME]


def needs_dns(policy: NetworkPolicy) -> bool:
    """Whether the sandbox must reach its resolver for the policy to be usable.

    Not under an allowlist with a wildcard: DNS then goes only to corral's own resolver
    (`network.wildcard`), and the sandbox's resolvers are closed. (Where a provider runs
    corral's resolver, it serves exact hostnames too: Docker's renderer closes the
    sandbox's resolvers for every policy that `uses_resolver`.)"""
    if policy.network_mode is NetworkMode.ALLOWLIST:
        if any(t.entry_type is EntryType.WILDCARD_HOSTNAME for t in policy.allowed_hosts):
            return False
        return any(t.entry_type is EntryType.HOSTNAME for t in policy.allowed_hosts)
    return policy.network_mode in (NetworkMode.PUBLIC, NetworkMode.DENYLIST)
