"""Wildcard hostnames: the rules around corral's resolver and its sets, and who may
declare them (the resolver itself is tested in helper/dns_test.go)."""

from __future__ import annotations

import ipaddress
import json

import pytest

from corral import ENVIRONMENTS, NetworkPolicy, NetworkSchedule
from corral.errors import NetworkPolicyUnsupported
from corral.network import Resolution, render_iptables
from corral.network.probe import forbidden_probe
from corral.network.resolve import needs_dns
from corral.network.targets import EntryType
from corral.network.wildcard import (
    UPSTREAM_MARK,
    NameSets,
    has_wildcards,
    refuse_all_config,
    uses_resolver,
)

UPSTREAM = (ipaddress.ip_address("10.214.1.1"), ipaddress.ip_address("fd00:53::1"))
SETS = NameSets(generation="0badcafe", upstream=UPSTREAM, connmark=0x1234)
POLICY = NetworkPolicy.allowlist("*.allowed.test", "*.tls.test:443", "192.0.2.1", "api.test")
RESOLVED = Resolution(
    addresses={"api.test": (ipaddress.ip_address("203.0.113.5"),)},
    dns_servers=(ipaddress.ip_address("127.0.0.11"),),
    names=SETS,
)


def _chain(text: str) -> list[str]:
    return [
        line.removeprefix("-A CORRAL-EGRESS ")
        for line in text.splitlines()
        if line.startswith("-A CORRAL-EGRESS ")
    ]


def _index(lines: list[str], needle: str) -> int:
    return next(i for i, line in enumerate(lines) if needle in line)


@pytest.mark.parametrize("family", [4, 6])
def test_the_resolvers_upstream_is_accepted_first_and_only_by_its_mark(family: int) -> None:
    payload = render_iptables(POLICY, RESOLVED, phase="run")
    lines = _chain(payload.ipv4 if family == 4 else payload.ipv6)
    server = next(a for a in UPSTREAM if a.version == family)
    prefix = 32 if family == 4 else 128
    assert lines[0].endswith("--ctdir REPLY -j ACCEPT")
    assert lines[1:3] == [
        f"-d {server}/{prefix} -p {proto} --dport 53 -m mark --mark {UPSTREAM_MARK:#x} -j ACCEPT"
        for proto in ("udp", "tcp")
    ]
    # The other family's upstream is not in this family's rules.
    assert not any(str(a) in "\n".join(lines) for a in UPSTREAM if a.version != family)
    assert lines[3] == "-m connmark --mark 0x1234 -j ACCEPT"
    first_reject = _index(lines, "-j REJECT")
    assert first_reject > 3


@pytest.mark.parametrize("family", [4, 6])
def test_dns_is_refused_before_any_learned_address(family: int) -> None:
    payload = render_iptables(POLICY, RESOLVED)
    lines = _chain(payload.ipv4 if family == 4 else payload.ipv6)
    # The sandbox's own resolver (Docker's embedded one) is closed, as under no-network.
    if family == 4:
        assert _index(lines, "-d 127.0.0.11/32 -p tcp -j REJECT") < _index(lines, "-o lo")
    dns_tcp = _index(lines, "-p tcp --dport 53 -j REJECT")
    dns_udp = _index(lines, "-p udp --dport 53 -j REJECT")
    first_set = _index(lines, "-m set")
    assert dns_tcp < first_set and dns_udp < first_set
    assert lines[-1].startswith("-j REJECT")


@pytest.mark.parametrize("family", [4, 6])
def test_sets_are_this_applys_only_per_port(family: int) -> None:
    text = render_iptables(POLICY, RESOLVED).ipv4 if family == 4 else ""
    if family == 6:
        text = render_iptables(POLICY, RESOLVED).ipv6
    sets = {
        line.split("--match-set ")[1].split()[0] for line in _chain(text) if "--match-set" in line
    }
    assert sets == {f"corral-0badcafe-any-{family}", f"corral-0badcafe-443-{family}"}
    lines = [line for line in _chain(text) if " -j NFLOG " not in line]
    any_port = [line for line in lines if f"corral-0badcafe-any-{family}" in line]
    match = f"-m set --match-set corral-0badcafe-any-{family} dst"
    unmarked = f"-m mark ! --mark {UPSTREAM_MARK:#x} -j REJECT --reject-with tcp-reset"
    assert any_port == [
        # TCP 443 and 80 only through the name gate (its dials carry the mark)
        f"{match} -p tcp --dport 443 {unmarked}",
        f"{match} -p tcp --dport 80 {unmarked}",
        f"{match} -j CONNMARK --set-mark 0x1234",
        f"{match} -j ACCEPT",
    ]
    tls = [line for line in lines if f"corral-0badcafe-443-{family}" in line]
    assert all("--dport 443" in line for line in tls) and len(tls) == 5
    assert tls[0].endswith(unmarked)
    # Every REJECT still logged first (the events feature).
    lines = _chain(text)
    rejects = [i for i, line in enumerate(lines) if " -j REJECT " in line]
    assert all(" -j NFLOG " in lines[i - 1] for i in rejects)


def test_the_listed_targets_keep_their_rules() -> None:
    lines = _chain(render_iptables(POLICY, RESOLVED).ipv4)
    assert "-d 192.0.2.1/32 -j ACCEPT" in lines
    assert "-d 203.0.113.5/32 -j ACCEPT" in lines


def test_the_sets_and_the_resolvers_configuration_agree() -> None:
    payload = SETS.ipset_payload(POLICY)
    created = {line.split()[1] for line in payload.splitlines()}
    assert created == {f"corral-0badcafe-{p}-{f}" for p in ("any", "443") for f in (4, 6)}
    assert all(len(name) <= 31 for name in created)
    assert "family inet6" in payload and "timeout 60" in payload
    config = json.loads(SETS.resolver_config(POLICY))
    assert config["generation"] == "0badcafe" and config["mark"] == UPSTREAM_MARK
    assert config["upstream"] == ["10.214.1.1", "fd00:53::1"]
    assert config["entries"] == [
        {
            "name": "allowed.test",
            "wildcard": True,
            "set4": "corral-0badcafe-any-4",
            "set6": "corral-0badcafe-any-6",
            "port": 0,
        },
        {
            "name": "tls.test",
            "wildcard": True,
            "set4": "corral-0badcafe-443-4",
            "set6": "corral-0badcafe-443-6",
            "port": 443,
        },
        # Exact hostnames go through the resolver too: a CDN's next answer is admitted.
        {
            "name": "api.test",
            "wildcard": False,
            "set4": "corral-0badcafe-any-4",
            "set6": "corral-0badcafe-any-6",
            "port": 0,
        },
    ]
    assert json.loads(refuse_all_config("off1"))["entries"] == []


def test_fresh_sets_differ_each_apply() -> None:
    one, two = NameSets.fresh(UPSTREAM), NameSets.fresh(UPSTREAM)
    assert one.generation != two.generation and one.connmark != two.connmark
    assert 0 < one.connmark < 1 << 31


def test_policies_that_name_no_allowed_host_render_as_before() -> None:
    for text in ("public", "no-network", "allowlist:192.0.2.1", "denylist:api.test"):
        policy = NetworkPolicy.model_validate(text)
        assert not has_wildcards(policy) and not uses_resolver(policy)
        plain = render_iptables(policy, RESOLVED.model_copy(update={"names": None}))
        assert render_iptables(policy, RESOLVED) == plain
        assert "--match-set" not in plain.ipv4 and "mark" not in plain.ipv4


EXACT = NetworkPolicy.allowlist("api.test", "192.0.2.1")


@pytest.mark.parametrize("family", [4, 6])
def test_an_exact_hostname_goes_through_corrals_resolver_too(family: int) -> None:
    """Docker's embedded resolver forwards from inside the namespace, which the allowlist
    refuses: the sandbox gets corral's resolver, as for a wildcard."""
    assert uses_resolver(EXACT) and not has_wildcards(EXACT)
    payload = render_iptables(EXACT, RESOLVED)
    lines = _chain(payload.ipv4 if family == 4 else payload.ipv6)
    assert lines[1].endswith(f"-m mark --mark {UPSTREAM_MARK:#x} -j ACCEPT")
    assert "-m connmark --mark 0x1234 -j ACCEPT" in lines
    if family == 4:
        # The embedded resolver is closed; the name's apply-time address is a static rule.
        assert _index(lines, "-d 127.0.0.11/32 -p tcp -j REJECT") < _index(lines, "-o lo")
        assert not any(line.startswith("-d 127.0.0.11/32 -j ACCEPT") for line in lines)
        # A listed address keeps its DNS; the name's address (which could be a resolver's)
        # comes after DNS is refused, as the ones its later answers add.
        refused = _index(lines, "--dport 53 -j REJECT")
        assert _index(lines, "-d 192.0.2.1/32 -j ACCEPT") < refused
        assert refused < _index(lines, "-d 203.0.113.5/32 -j ACCEPT") < _index(lines, "-m set")
    sets = {line.split("--match-set ")[1].split()[0] for line in lines if "--match-set" in line}
    assert sets == {f"corral-0badcafe-any-{family}"}
    entries = json.loads(SETS.resolver_config(EXACT))["entries"]
    assert entries == [
        {
            "name": "api.test",
            "wildcard": False,
            "set4": "corral-0badcafe-any-4",
            "set6": "corral-0badcafe-any-6",
            "port": 0,
        }
    ]


def test_dns_to_the_sandboxs_resolver_is_closed_under_a_wildcard() -> None:
    assert not needs_dns(POLICY)
    assert not needs_dns(NetworkPolicy.allowlist("*.allowed.test"))
    assert needs_dns(NetworkPolicy.allowlist("api.test"))


def test_the_probe_is_a_forbidden_address_whatever_the_wildcards() -> None:
    gateway = ipaddress.ip_address("172.30.0.1")
    assert forbidden_probe(POLICY, RESOLVED, [(gateway, 9)]) == (gateway, 9)


@pytest.mark.usefixtures("helper_shipped")
def test_docker_declares_wildcards_for_allowlists_only() -> None:
    docker = ENVIRONMENTS.get("docker").network_capabilities()
    assert EntryType.WILDCARD_HOSTNAME in docker.entry_types
    docker.check_policy(NetworkPolicy.allowlist("*.allowed.test"), "run")
    with pytest.raises(NetworkPolicyUnsupported) as refused:
        docker.check_schedule(
            NetworkSchedule(evaluation=NetworkPolicy.denylist("*.githubusercontent.com"))
        )
    message = str(refused.value)
    assert "'*.githubusercontent.com'" in message and "'evaluation'" in message
    assert "denylist" in message and "any resolver" in message
    docker.check_policy(NetworkPolicy.denylist("api.test"), "run")


def test_kubernetes_refuses_wildcards_clearly() -> None:
    k8s = ENVIRONMENTS.get("k8s").network_capabilities()
    assert EntryType.WILDCARD_HOSTNAME not in k8s.entry_types
    with pytest.raises(
        NetworkPolicyUnsupported, match=r"'\*\.allowed\.test' is a wildcard-hostname.*'run'"
    ):
        k8s.check_policy(NetworkPolicy.allowlist("*.allowed.test"), "run")


def test_the_upstream_servers_are_checked() -> None:
    from corral.providers.docker import DockerConfig

    assert DockerConfig(upstream_dns_servers=("10.0.0.2",)).upstream_dns_servers == ("10.0.0.2",)
    for bad in ("127.0.0.11", "resolver.test", "0.0.0.0"):
        with pytest.raises(ValueError, match="upstream_dns_servers"):
            DockerConfig(upstream_dns_servers=(bad,))
