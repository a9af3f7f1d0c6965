"""Render a policy as `iptables-restore` and `ip6tables-restore` payloads.

The payload replaces the whole `filter` table of the sandbox's own network namespace in
one transaction, so a switch never shows the union of two policies or none at all.

Egress is filtered statelessly by destination: a connection opened under an old policy
does not survive a switch to a stricter one. The only conntrack exception is the reply
direction of connections that came *in* (a server behind `endpoint(port)`), which never
lets the sandbox originate anything.

Each payload also carries the policy it enforces (`policy_record`), so that what is in
force can be read back from the kernel.

Every REJECT is preceded by an NFLOG rule with the same match (rate-limited, headers only,
to group `NFLOG_GROUP`, prefixed with the phase the rules are rendered for): the refused
attempt is logged in the sandbox's own namespace, where only a holder of NET_ADMIN can
read it, and the REJECT counters still count every refusal (the probes rely on them).
Every rule that admits traffic out of the sandbox (the policy's own accepts, not the
namespace's plumbing: replies, loopback, neighbour discovery, corral's resolver) is
preceded the same way by an NFLOG rule for new flows only (`--ctstate NEW`), prefixed
`...:allowed`: what the workload reached, one event per connection or UDP flow.

An allowlist that names a host, exact or wildcard (`network.wildcard.uses_resolver`), also
accepts, first, the upstream DNS of corral's resolver (by its socket mark) and the rest
of connections its sets accepted (by this apply's connmark); the sandbox's own resolvers
(Docker's embedded one) are closed; after the listed addresses it refuses all DNS, then
accepts the exact names' addresses as resolved at apply time and the addresses in this
apply's sets (so a name's address never opens port 53, unless listed as `name:53`).

Addresses enter the text only through `rule_text`, rebuilt from their integers: nothing a
policy or the sandbox wrote (a zone id, a newline) can become a rule line.
"""

from __future__ import annotations

import ipaddress

from pydantic import BaseModel, ConfigDict

from corral.network.addresses import rule_text
from corral.network.events import LOG_BURST, LOG_COPY_BYTES, LOG_RATE_PER_S, NFLOG_GROUP, log_prefix
from corral.network.gate import render_gate, to_the_gate, ungated
from corral.network.link import LINK
from corral.network.policy import NetworkMode, NetworkPolicy, Phase
from corral.network.policy_record import RECORD_CHAIN, PolicyRecord, record_rules
from corral.network.resolve import AddressRule, Resolution, address_rules, needs_dns
from corral.network.targets import EntryType, IPAddress
from corral.network.wildcard import UPSTREAM_MARK, NameSets, uses_resolver

CHAIN = "CORRAL-EGRESS"


class IptablesPayload(BaseModel):
    model_config = ConfigDict(frozen=True)

    ipv4: str
    ipv6: str
    #: corral's chain of the IPv4 `nat` table (`iptables-restore --noflush`: Docker's own
    #: nat rules there stay): the name gate's DNATs, or nothing
    nat4: str = ""


Endpoint = tuple[IPAddress, int]


def render_iptables(
    policy: NetworkPolicy,
    resolved: Resolution,
    *,
    phase: Phase | None = None,
    endpoints: tuple[Endpoint, ...] = (),
) -> IptablesPayload:
    """Both payloads; refused attempts are logged with `phase` (None: outside any).

    An allowlist that names a host needs `resolved.names`, the sets of this apply.
    `endpoints` (address, TCP port) are admitted in every mode, first: corral's own
    services for the sandbox on the harness's host (its credential proxy)."""
    wild = resolved.names if uses_resolver(policy) else None
    if uses_resolver(policy) and wild is None:
        raise ValueError(f"policy {policy} names hosts: render it with its sets")
    rules = address_rules(policy, resolved, skip_wildcards=wild is not None)
    return IptablesPayload(
        ipv4=_render_family(policy, resolved, rules, 4, phase, wild, endpoints),
        ipv6=_render_family(policy, resolved, rules, 6, phase, wild, endpoints),
        nat4=render_gate(policy, rules, _named(policy, resolved), wild, endpoints),
    )


def _nflog(prefix: str) -> str:
    return (
        f"-m limit --limit {LOG_RATE_PER_S}/second --limit-burst {LOG_BURST} "
        f"-j NFLOG --nflog-group {NFLOG_GROUP} --nflog-prefix {prefix} "
        f"--nflog-size {LOG_COPY_BYTES}"
    )


def _admitting(rules: list[str], phase: Phase | None) -> list[str]:
    """Each rule that admits a flow preceded by an NFLOG rule of the same match for its
    first packet (`--ctstate NEW`)."""
    log = f"-m conntrack --ctstate NEW {_nflog(log_prefix(phase, 'allowed'))}"
    lines: list[str] = []
    for rule in rules:
        match, _, _ = rule.partition("-j ")
        lines += [f"{match}{log}", rule]
    return lines


def _logged(body: list[str], prefix: str) -> list[str]:
    """Each REJECT preceded by an NFLOG rule of the same match."""
    log = _nflog(prefix)
    lines: list[str] = []
    for rule in body:
        match, reject, _ = rule.partition("-j REJECT ")
        if reject:
            lines.append(f"{match}{log}")
        lines.append(rule)
    return lines


def _render_family(
    policy: NetworkPolicy,
    resolved: Resolution,
    rules: list[AddressRule],
    family: int,
    phase: Phase | None,
    wild: NameSets | None = None,
    endpoints: tuple[Endpoint, ...] = (),
) -> str:
    reject_icmp = "icmp-port-unreachable" if family == 4 else "icmp6-port-unreachable"
    reject = [
        "-p tcp -j REJECT --reject-with tcp-reset",
        f"-j REJECT --reject-with {reject_icmp}",
    ]
    body = [
        "-m conntrack --ctstate ESTABLISHED,RELATED --ctdir REPLY -j ACCEPT",
    ]
    for address, port in endpoints:
        if address.version == family:
            dest = f"-d {rule_text(ipaddress.ip_network(address))}"
            body += _admitting([f"{dest} -p tcp --dport {port} -j ACCEPT"], phase)
    if wild is not None:
        body += _resolver_upstream(wild, family)
    # Under corral's resolver the sandbox's own resolvers are closed, as under no-network.
    dns_open = needs_dns(policy) and wild is None
    for server in resolved.dns_servers:
        if server.version != family:
            continue
        dest = f"-d {rule_text(ipaddress.ip_network(server))}"
        if not dns_open:
            body += [f"{dest} {r}" for r in reject]
        elif server.is_loopback:
            # Docker's embedded resolver is NATed to a random port on loopback.
            body.append(f"{dest} -j ACCEPT")
        else:
            body += [f"{dest} -p {proto} --dport 53 -j ACCEPT" for proto in ("udp", "tcp")]
    body.append("-o lo -j ACCEPT")
    if wild is not None and family == 4:
        body += to_the_gate()
    if family == 6:
        # Neighbour discovery is IPv6's ARP: without it not even allowed hosts are reachable.
        body += [
            f"-p ipv6-icmp --icmpv6-type {kind} -j ACCEPT"
            for kind in ("router-solicitation", "neighbour-solicitation", "neighbour-advertisement")
        ]
    mode = policy.network_mode
    if mode is NetworkMode.PUBLIC:
        body += _admitting(["-j ACCEPT"], phase)
    elif mode is NetworkMode.NO_NETWORK:
        body += reject
    elif mode is NetworkMode.ALLOWLIST:
        named = _named(policy, resolved) if wild is not None else set[AddressRule]()
        for rule in _family([r for r in rules if r not in named], family):
            body += _admitting(_match(rule, "-j ACCEPT"), phase)
        if wild is not None:
            body += _refuse_dns(reject_icmp)
            # A name's addresses as resolved at apply time, after the refusal: like the
            # ones its answers add later, they never open DNS (unless listed with :53).
            for rule in _family([r for r in rules if r in named], family):
                body += ungated(f"-d {rule_text(rule.network)}", rule.port)
                body += _admitting(_match(rule, "-j ACCEPT"), phase)
            body += _learned(policy, wild, family, phase)
        body += reject
    else:
        for rule in _family(rules, family):
            body += _deny(rule, reject_icmp)
        body += _admitting(["-j ACCEPT"], phase)
    lines = [
        "*filter",
        ":INPUT ACCEPT [0:0]",
        ":FORWARD DROP [0:0]",
        ":OUTPUT ACCEPT [0:0]",
        f":{CHAIN} - [0:0]",
        f":{RECORD_CHAIN} - [0:0]",
        *record_rules(PolicyRecord(policy=policy, dns_servers=resolved.dns_servers)),
        f"-A OUTPUT -j {CHAIN}",
        *_gateway_hooks(family),
        *(f"-A {CHAIN} {rule}" for rule in _logged(body, log_prefix(phase))),
        "COMMIT",
        "",
    ]
    return "\n".join(lines)


def _gateway_hooks(family: int) -> list[str]:
    """A gateway's link into `CHAIN` (no-ops in a namespace without the link): what the
    sandbox sends to the holder or through it, and back only replies and what came in for
    it (published ports, DNATed by the gateway). Loopback only as a DNAT made it (the
    link's DNS), never addressed by the sandbox itself."""
    loopback = "127.0.0.0/8" if family == 4 else "::1/128"
    return [
        f"-A INPUT -i {LINK} -d {loopback} -m conntrack ! --ctstate DNAT -j DROP",
        f"-A INPUT -i {LINK} -j {CHAIN}",
        f"-A FORWARD -o {LINK} -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
        f"-A FORWARD -o {LINK} -m conntrack --ctstate DNAT -j ACCEPT",
        f"-A FORWARD -i {LINK} -j {CHAIN}",
    ]


def _resolver_upstream(wild: NameSets, family: int) -> list[str]:
    """First: corral's resolver to its upstream (by mark), and the rest of connections
    this apply's sets accepted (by connmark)."""
    lines: list[str] = []
    for server in wild.upstream:
        if server.version != family:
            continue
        dest = f"-d {rule_text(ipaddress.ip_network(server))}"
        lines += [
            f"{dest} -p {proto} --dport 53 -m mark --mark {UPSTREAM_MARK:#x} -j ACCEPT"
            for proto in ("udp", "tcp")
        ]
    lines.append(f"-m connmark --mark {wild.connmark:#x} -j ACCEPT")
    return lines


def _named(policy: NetworkPolicy, resolved: Resolution) -> set[AddressRule]:
    """The rules only an exact hostname (not listed with port 53) brings in: no address or
    CIDR entry of the policy gives them too."""
    listed = {AddressRule(t.network(), t.port) for t in policy.targets if not t.is_hostname}
    return {
        AddressRule(ipaddress.ip_network(a), t.port)
        for t in policy.targets
        if t.entry_type is EntryType.HOSTNAME and t.port != 53
        for a in resolved.addresses.get(t.host, ())
    } - listed


def _refuse_dns(reject_icmp: str) -> list[str]:
    """DNS refused to everything but corral's resolver (on loopback, accepted above) and
    the policy's listed addresses."""
    return [
        "-p tcp --dport 53 -j REJECT --reject-with tcp-reset",
        f"-p udp --dport 53 -j REJECT --reject-with {reject_icmp}",
    ]


def _learned(policy: NetworkPolicy, wild: NameSets, family: int, phase: Phase | None) -> list[str]:
    """The addresses corral's resolver's answers put in this apply's sets, by port."""
    lines: list[str] = []
    for port in wild.ports(policy):
        match = f"-m set --match-set {wild.set_name(port, family)} dst"
        lines += ungated(match, port)
        protos = [""] if port is None else [f" -p {p} --dport {port}" for p in ("tcp", "udp")]
        for proto in protos:
            lines += _admitting(
                [f"{match}{proto} -j CONNMARK --set-mark {wild.connmark:#x}"], phase
            )
            lines.append(f"{match}{proto} -j ACCEPT")
    return lines


def _family(rules: list[AddressRule], family: int) -> list[AddressRule]:
    return [r for r in rules if r.network.version == family]


def _match(rule: AddressRule, action: str) -> list[str]:
    dest = f"-d {rule_text(rule.network)}"
    if rule.port is None:
        return [f"{dest} {action}"]
    return [f"{dest} -p {proto} --dport {rule.port} {action}" for proto in ("tcp", "udp")]


def _deny(rule: AddressRule, reject_icmp: str) -> list[str]:
    dest = f"-d {rule_text(rule.network)}"
    port = "" if rule.port is None else f" --dport {rule.port}"
    other = f"{dest} -p udp{port}" if rule.port is not None else dest
    return [
        f"{dest} -p tcp{port} -j REJECT --reject-with tcp-reset",
        f"{other} -j REJECT --reject-with {reject_icmp}",
    ]
