"""Hostnames in allowlists (exact, and wildcards `*.example.com`), enforced through a
resolver of corral's own (Docker: the helper's `--dns` mode in the holder, see
`helper/dns.go`).

A wildcard cannot be expanded to addresses when a policy is applied, and an exact name's
addresses move (CDNs), so addresses are also learned when the sandbox asks for a name:
under an allowlist that names a host (`uses_resolver`), the only resolver the sandbox can
reach is corral's, on `RESOLVER` in its network namespace. It forwards the names the
policy allows (under a wildcard, or one of its exact hostnames) to the upstream
resolvers, adds every address of the answer to an ipset for the answer's TTL, and only
then answers; every other name is refused and never leaves. An exact hostname's
addresses, as corral resolved them at apply time (over the same marked upstream path, or
from `extra_hosts`), are also static rules: reachable at once.

Docker's embedded resolver cannot serve such a policy: it forwards from inside the
sandbox's namespace, unmarked, exactly as the sandbox itself would.

The rules accept an address in a set (per port of the policy's entries), and the rest of
a connection that one accepted: a long transfer outlives the entry's TTL, but not a
switch (each apply has its own connmark). The resolver's upstream packets carry
`UPSTREAM_MARK`, which only a holder of NET_ADMIN in the namespace can set: the sandbox's
own DNS, to any resolver, is refused.

Sets carry the apply's generation in their names: a switch creates the new ones, points
the resolver at them, replaces the rules (which reference only the new sets) and then
destroys the old ones, so the addresses an old policy learned are never reachable under
a new one.
"""

from __future__ import annotations

import ipaddress
import json
import secrets

from pydantic import BaseModel, ConfigDict

from corral.network.addresses import IPAddress
from corral.network.policy import NetworkMode, NetworkPolicy
from corral.network.targets import EntryType

#: where corral's resolver listens (UDP and TCP, port 53) in the sandbox's namespace
RESOLVER = ipaddress.IPv4Address("127.0.0.54")
#: SO_MARK of the resolver's upstream sockets; setting it needs NET_ADMIN (or NET_RAW,
#: since Linux 5.17), which the sandbox never has
UPSTREAM_MARK = 0x636F7201
#: Bounds on how long an answer's address stays in a set. The floor covers clients that
#: keep an answer a little past a tiny TTL (the JVM keeps them 30 s) and the time between
#: a lookup and its connect; the ceiling bounds how long an address a name has moved away
#: from stays reachable. A connection already accepted lives on past both (its connmark).
TTL_MIN_S = 60
TTL_MAX_S = 3600
#: every set corral creates in a namespace starts with this
SET_PREFIX = "corral-"
#: entries per set: a flood of lookups under a wildcard cannot grow it past this (the
#: resolver then answers SERVFAIL: no address the rules would refuse is handed out)
SET_MAX_ENTRIES = 65536


def has_wildcards(policy: NetworkPolicy) -> bool:
    """Whether `policy` is an allowlist with a wildcard hostname."""
    return policy.network_mode is NetworkMode.ALLOWLIST and any(
        t.entry_type is EntryType.WILDCARD_HOSTNAME for t in policy.targets
    )


def uses_resolver(policy: NetworkPolicy) -> bool:
    """Whether `policy` is an allowlist that names a host, exact or wildcard: the sandbox
    then resolves through corral's resolver only."""
    return policy.network_mode is NetworkMode.ALLOWLIST and any(
        t.is_hostname for t in policy.targets
    )


class NameSets(BaseModel):
    """One apply's sets and resolver configuration for a policy that `uses_resolver`."""

    model_config = ConfigDict(frozen=True)

    #: distinguishes this apply's sets from the ones they replace (8 hex digits)
    generation: str
    #: the resolvers corral's resolver forwards allowed names to
    upstream: tuple[IPAddress, ...]
    #: marks connections a set accepted, so that their later packets pass (per apply)
    connmark: int

    @classmethod
    def fresh(cls, upstream: tuple[IPAddress, ...]) -> NameSets:
        return cls(
            generation=secrets.token_hex(4),
            upstream=upstream,
            connmark=secrets.randbelow(0x7FFFFFFE) + 1,
        )

    def set_name(self, port: int | None, family: int) -> str:
        """At most 24 characters (ipset allows 31)."""
        return f"{SET_PREFIX}{self.generation}-{port or 'any'}-{family}"

    def ports(self, policy: NetworkPolicy) -> list[int | None]:
        """The ports of the policy's hostname entries: one pair of sets each."""
        return list(dict.fromkeys(t.port for t in policy.targets if t.is_hostname))

    def ipset_payload(self, policy: NetworkPolicy) -> str:
        """`ipset -exist restore` input creating this apply's sets (kept if they exist)."""
        lines = [
            f"create {self.set_name(port, family)} hash:ip family "
            f"{'inet' if family == 4 else 'inet6'} timeout {TTL_MIN_S} "
            f"maxelem {SET_MAX_ENTRIES}"
            for port in self.ports(policy)
            for family in (4, 6)
        ]
        return "\n".join(lines) + "\n"

    def resolver_config(self, policy: NetworkPolicy) -> str:
        """The resolver's `config.json`: which names it forwards, into which sets."""
        entries = [
            {
                "name": t.host.removeprefix("*."),
                "wildcard": t.entry_type is EntryType.WILDCARD_HOSTNAME,
                "set4": self.set_name(t.port, 4),
                "set6": self.set_name(t.port, 6),
                "port": t.port or 0,
            }
            for t in policy.targets
            if t.is_hostname
        ]
        return json.dumps(
            {
                "generation": self.generation,
                "upstream": [str(a) for a in self.upstream],
                "mark": UPSTREAM_MARK,
                "ttl_min": TTL_MIN_S,
                "ttl_max": TTL_MAX_S,
                "entries": entries,
            },
            sort_keys=True,
        )


def refuse_all_config(generation: str) -> str:
    """A configuration that refuses every name (a policy that does not `uses_resolver`)."""
    return json.dumps(
        {
            "generation": generation,
            "upstream": [],
            "mark": UPSTREAM_MARK,
            "ttl_min": TTL_MIN_S,
            "ttl_max": TTL_MAX_S,
            "entries": [],
        },
        sort_keys=True,
    )
