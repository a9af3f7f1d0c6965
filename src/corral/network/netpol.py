"""Render a policy as a Kubernetes NetworkPolicy manifest."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from corral.network.addresses import rule_text
from corral.network.policy import NetworkMode, NetworkPolicy
from corral.network.resolve import AddressRule, Resolution, address_rules, needs_dns

_ALL = {4: ipaddress.ip_network("0.0.0.0/0"), 6: ipaddress.ip_network("::/0")}


def render_network_policy(
    policy: NetworkPolicy,
    resolved: Resolution,
    selector: Mapping[str, str],
    *,
    name: str,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A `networking.k8s.io/v1` NetworkPolicy selecting the sandbox Pod by `selector`.

    Every mode, `public` included, is one policy of both types, so that switching is a
    patch of one object and never a create or delete. Every CIDR is written by
    `rule_text`, so nothing but an address block reaches the manifest from the policy.
    Ingress has no rule in any mode: no other Pod (another sandbox included) may open a
    connection into a sandbox. Replies to the sandbox's own connections are not ingress,
    and `endpoint(port)` arrives through the kubelet's port-forward on the Pod's
    loopback, which no NetworkPolicy filters.
    """
    rules = address_rules(policy, resolved)
    mode = policy.network_mode
    egress: list[dict[str, Any]]
    if mode is NetworkMode.PUBLIC:
        egress = [{}]
    elif mode is NetworkMode.NO_NETWORK:
        egress = []
    elif mode is NetworkMode.ALLOWLIST:
        egress = [_allow(rule) for rule in rules]
    else:
        egress = _denylist(rules)
    if mode is not NetworkMode.PUBLIC and needs_dns(policy) and resolved.dns_servers:
        egress.insert(0, _dns(resolved))
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {
            "podSelector": {"matchLabels": dict(selector)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": egress,
        },
    }


def _ports(port: int | None) -> list[dict[str, Any]]:
    if port is None:
        return []
    return [{"protocol": proto, "port": port} for proto in ("TCP", "UDP")]


def _allow(rule: AddressRule) -> dict[str, Any]:
    entry: dict[str, Any] = {"to": [{"ipBlock": {"cidr": rule_text(rule.network)}}]}
    if rule.port is not None:
        entry["ports"] = _ports(rule.port)
    return entry


def _dns(resolved: Resolution) -> dict[str, Any]:
    servers = [ipaddress.ip_network(s) for s in resolved.dns_servers]
    return {
        "to": [{"ipBlock": {"cidr": rule_text(s)}} for s in servers],
        "ports": [{"protocol": proto, "port": 53} for proto in ("UDP", "TCP")],
    }


def _denylist(rules: list[AddressRule]) -> list[dict[str, Any]]:
    """Everything except the denied blocks; a denied port leaves the host's other ports."""
    whole = [r.network for r in rules if r.port is None]
    egress: list[dict[str, Any]] = []
    blocks: list[dict[str, Any]] = []
    for family, everything in _ALL.items():
        # A host denied on one port is excepted here too and gets its other ports back below.
        excepted = sorted(
            {rule_text(r.network) for r in rules if r.network.version == family}
            - {rule_text(everything)}
        )
        if any(n == everything for n in whole):
            continue
        block: dict[str, Any] = {"cidr": rule_text(everything)}
        if excepted:
            block["except"] = excepted
        blocks.append({"ipBlock": block})
    if blocks:
        egress.append({"to": blocks})
    for rule in rules:
        if rule.port is None or any(rule.network.subnet_of(w) for w in _same(whole, rule)):
            continue
        ranges = [(1, rule.port - 1), (rule.port + 1, 65535)]
        ports = [
            {"protocol": proto, "port": lo, **({"endPort": hi} if hi > lo else {})}
            for proto in ("TCP", "UDP")
            for lo, hi in ranges
            if lo <= hi
        ]
        egress.append({"to": [{"ipBlock": {"cidr": rule_text(rule.network)}}], "ports": ports})
    return egress


def _same(
    networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network], rule: AddressRule
) -> list[Any]:
    return [n for n in networks if n.version == rule.network.version]
