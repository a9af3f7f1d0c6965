"""The policy record a ruleset carries: written by the renderer, read back from its text."""

from __future__ import annotations

import ipaddress

import pytest

from corral import NetworkPolicy
from corral.network import Resolution, render_iptables
from corral.network.policy_record import PolicyRecord, read_record, record_rules

SERVERS = (ipaddress.ip_address("127.0.0.11"), ipaddress.ip_address("fd00::53"))
MANY = NetworkPolicy.allowlist(*(f"10.{i}.0.0/16:{1000 + i}" for i in range(40)))


@pytest.mark.parametrize(
    "policy",
    [NetworkPolicy.public(), NetworkPolicy.no_network(), MANY, NetworkPolicy.denylist("a.test")],
    ids=str,
)
def test_a_rendered_table_reads_back_as_its_policy(policy: NetworkPolicy) -> None:
    resolved = Resolution(
        addresses={"a.test": (ipaddress.ip_address("192.0.2.1"),)}, dns_servers=SERVERS
    )
    payload = render_iptables(policy, resolved)
    for text in (payload.ipv4, payload.ipv6):
        assert read_record(text) == PolicyRecord(policy=policy, dns_servers=SERVERS)


def test_a_long_record_is_split_under_the_comment_limit() -> None:
    rules = record_rules(PolicyRecord(policy=MANY, dns_servers=SERVERS))
    assert len(rules) > 1
    # The kernel keeps 255 bytes of a comment; the quoted text is what it stores.
    assert all(len(rule.split('"')[1]) <= 255 for rule in rules)


def test_iptables_save_may_drop_the_quotes() -> None:
    record = PolicyRecord(policy=NetworkPolicy.no_network(), dns_servers=SERVERS)
    saved = "\n".join(rule.replace('"', "") for rule in record_rules(record))
    assert read_record(saved) == record


RULES = record_rules(PolicyRecord(policy=MANY, dns_servers=SERVERS))
TOTAL = f"/{len(RULES)}:"
DAMAGED: dict[str, tuple[list[str], str]] = {
    "missing": ([], "no policy record"),
    "incomplete": (RULES[:-1], "pieces"),
    "repeated": ([*RULES, RULES[0]], "appears twice"),
    "mixed-totals": ([RULES[0].replace(TOTAL, "/99:"), *RULES[1:]], "pieces"),
    "garbled": ([r.replace(":e", ":f", 1) for r in RULES], "not one corral wrote"),
}


@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_a_damaged_record_is_refused(case: str) -> None:
    rules, message = DAMAGED[case]
    with pytest.raises(ValueError, match=message):
        read_record("\n".join(rules))


def test_rules_of_other_chains_are_not_read() -> None:
    record = PolicyRecord(policy=NetworkPolicy.public(), dns_servers=())
    forged = [r.replace("CORRAL-POLICY", "CORRAL-EGRESS") for r in record_rules(record)]
    with pytest.raises(ValueError, match="no policy record"):
        read_record("\n".join(forged))
