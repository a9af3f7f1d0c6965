"""corral's name gate: exact by name for TLS and HTTP under an allowlist that names hosts.

An address that only a hostname entry admits (the name's addresses at apply time, and
the ones corral's resolver learns into the apply's sets) is shared, behind a CDN, by
names the policy never allowed. So a TCP connection to port 443 or 80 of such an address
is DNATed, in the sandbox's namespace, to the gate (part of corral's resolver in the
holder, `helper/gate.go`), which reads the TLS SNI or the Host of the connection's one
HTTP request and goes on to the original destination only for a name the policy allows
on that port, from a socket carrying `UPSTREAM_MARK`; a switch cuts what went on for a
name it no longer allows. The filter rules refuse the same connections when they carry
no mark: without the DNAT (a failed apply, a rule the sandbox cannot reach but that is
not there yet) they fail closed.

What stays address-level (SECURITY.md says so): addresses a policy lists as addresses or
CIDRs, other ports, UDP (QUIC), and IPv6, where the gate does not listen: TCP 443 and 80
of a name's IPv6 addresses are refused.
"""

from __future__ import annotations

import ipaddress

from corral.network.addresses import rule_text
from corral.network.link import HOLDER_SIDE, LINK
from corral.network.policy import NetworkPolicy
from corral.network.resolve import AddressRule
from corral.network.targets import IPAddress
from corral.network.wildcard import RESOLVER, UPSTREAM_MARK, NameSets

#: corral's chain in the sandbox namespace's `nat` table, jumped to first from OUTPUT (and
#: from PREROUTING for a gateway's link)
GATE_CHAIN = "CORRAL-GATE"
#: original port -> the gate's port on `RESOLVER` (what the gate reads there)
GATED_PORTS = {443: 10443, 80: 10080}


def to_the_gate() -> list[str]:
    """Filter rules (IPv4) accepting what the DNATs sent to the gate and, from a gateway's
    link, to the resolver: `-o lo` does not match them, since a rule sees the interface
    routed to before the DNAT (or, arriving on the link, none)."""
    return [
        *(f"-d {RESOLVER}/32 -p {proto} --dport 53 -j ACCEPT" for proto in ("udp", "tcp")),
        *(f"-d {RESOLVER}/32 -p tcp --dport {port} -j ACCEPT" for port in GATED_PORTS.values()),
    ]


def ungated(match: str, port: int | None) -> list[str]:
    """Filter rules refusing what `match` (with `port`) admits on the gated ports to
    anything but the gate's own dials."""
    return [
        f"{match} -p tcp --dport {gated} -m mark ! --mark {UPSTREAM_MARK:#x} "
        "-j REJECT --reject-with tcp-reset"
        for gated in GATED_PORTS
        if port in (None, gated)
    ]


def render_gate(
    policy: NetworkPolicy,
    rules: list[AddressRule],
    named: set[AddressRule],
    wild: NameSets | None,
    endpoints: tuple[tuple[IPAddress, int], ...],
) -> str:
    """The IPv4 `nat` payload for `iptables-restore --noflush`: GATE_CHAIN emptied, then,
    for a policy that names hosts, its DNATs to the gate."""
    lines = ["*nat", f":{GATE_CHAIN} - [0:0]"]
    if wild is not None:
        chain = f"-A {GATE_CHAIN}"
        lines.append(f"{chain} -m mark --mark {UPSTREAM_MARK:#x} -j RETURN")
        # A gateway's sandbox asks the link's address (its nameserver) for names.
        lines += [
            f"{chain} -i {LINK} -d {HOLDER_SIDE}/32 -p {proto} --dport 53 -j DNAT "
            f"--to-destination {RESOLVER}:53"
            for proto in ("udp", "tcp")
        ]
        # Listed addresses (and corral's own endpoints) stay address-level, as in filter.
        listed = [(r.network, r.port) for r in rules if r not in named]
        listed += [(ipaddress.ip_network(a), p) for a, p in endpoints]
        for network, port in listed:
            if network.version == 4:
                lines += [
                    f"{chain} -d {rule_text(network)} -p tcp --dport {gated} -j RETURN"
                    for gated in GATED_PORTS
                    if port in (None, gated)
                ]
        matches = [
            (f"-d {rule_text(r.network)}", r.port)
            for r in sorted(named, key=lambda r: (str(r.network), r.port or 0))
            if r.network.version == 4
        ]
        matches += [
            (f"-m set --match-set {wild.set_name(port, 4)} dst", port)
            for port in wild.ports(policy)
        ]
        for match, port in matches:
            lines += [
                f"{chain} {match} -p tcp --dport {gated} -j DNAT "
                f"--to-destination {RESOLVER}:{GATED_PORTS[gated]}"
                for gated in GATED_PORTS
                if port in (None, gated)
            ]
    return "\n".join([*lines, "COMMIT", ""])
