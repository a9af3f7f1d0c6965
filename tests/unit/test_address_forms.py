"""Address forms the sandbox's C library reads differently from Python, and rule injection.

Each hostile form either fails validation with an error naming the entry, or becomes the
address the kernel will use; whatever a policy or the sandbox wrote, rendered payloads hold
nothing but rebuilt addresses.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral import NetworkPolicy
from corral.network import Resolution, render_iptables, render_network_policy
from corral.network.addresses import inet_aton
from corral.network.wildcard import NameSets

INJECTED = "-A CORRAL-EGRESS -j ACCEPT"
#: corral's resolver's sets: an allowlist that names a host renders only with them
SETS = NameSets(generation="0badcafe", upstream=(ipaddress.ip_address("fd00::53"),), connmark=7)
# Every line an iptables payload may hold: a table, chain headers, and rules of tokens
# without spaces, '%' or anything else a zone id could bring.
PAYLOAD_LINE = re.compile(
    r"\*filter|\*nat|COMMIT|:[A-Z-]+ (ACCEPT|DROP|-) \[0:0\]|-A [A-Z-]+( [-\w,./:]+| !)+|"
    # the policy record: base64 text only
    r'-A CORRAL-POLICY -m comment --comment "corral-policy:\d+/\d+:[-\w=]+"|'
)


def _render_all(policy: NetworkPolicy, resolved: Resolution) -> str:
    payload = render_iptables(policy, resolved)
    for text in (payload.ipv4, payload.ipv6, payload.nat4):
        bad = [line for line in text.split("\n") if not PAYLOAD_LINE.fullmatch(line)]
        assert bad == [], f"unexpected text in the payload: {bad}"
    manifest = render_network_policy(policy, resolved, {"corral.session": "s"}, name="n")
    return "\n".join(
        [payload.ipv4, payload.ipv6, payload.nat4, json.dumps(manifest, sort_keys=True)]
    )


C_LIBRARY_FORMS = [
    "127.1",
    "127.0.1",
    "0x7f.1",
    "0x7f000001",
    "0X7F000001",
    "017700000001",
    "2130706433",
    "0177.0.0.1",
    "0x7f.0.0.0x1",
    "127.000.000.001",
]


@pytest.mark.parametrize("raw", C_LIBRARY_FORMS)
@pytest.mark.parametrize("shape", ["string", "mapping", "with-port"])
def test_inet_aton_forms_are_refused_naming_the_entry_and_the_address(raw: str, shape: str) -> None:
    assert inet_aton(raw) == ipaddress.IPv4Address("127.0.0.1")
    entry: Any = {"string": raw, "mapping": {"host": raw}, "with-port": f"{raw}:443"}[shape]
    for build in (NetworkPolicy.allowlist, NetworkPolicy.denylist):
        with pytest.raises(ValueError, match=re.escape(repr(raw)) + r".*127\.0\.0\.1"):
            build(entry)


@pytest.mark.parametrize("raw", ["1.2.3.4.5", "09.1", "256.1.1.1", "1.0x1000000", "0x1.2.3.256"])
def test_numeric_names_the_c_library_refuses_are_refused_too(raw: str) -> None:
    assert inet_aton(raw) is None
    with pytest.raises(ValueError, match=re.escape(repr(raw)) + ".*not a valid IP address"):
        NetworkPolicy.denylist(raw)


def test_names_with_a_letter_label_stay_hostnames() -> None:
    policy = NetworkPolicy.denylist("0x7f.example", "1.example", "cafe.0x1.com")
    assert [t.entry_type.value for t in policy.denied_hosts] == ["hostname"] * 3


@pytest.mark.parametrize(
    "entry",
    [
        {"host": "fe80::1%eth0"},
        {"host": f"fe80::1%x\n{INJECTED}"},
        {"host": f"fe80::1%x {INJECTED}", "port": 443},
        {"host": "fe80::%eth0/64"},
        "[fe80::1%eth0]:80",
        "fe80::1%25eth0",
    ],
)
def test_zone_ids_are_refused(entry: Any) -> None:
    for build in (NetworkPolicy.allowlist, NetworkPolicy.denylist):
        with pytest.raises(ValueError, match="zone id") as info:
            build(entry)
        assert "fe80::" in str(info.value)


@given(st.ip_addresses(v=6), st.text(min_size=1))
def test_no_zone_text_survives_validation(address: ipaddress.IPv6Address, zone: str) -> None:
    with pytest.raises(ValueError):
        NetworkPolicy.denylist({"host": f"{address}%{zone}"})


@pytest.mark.parametrize(
    ("raw", "host", "kind"),
    [
        ("::ffff:192.0.2.7", "192.0.2.7", "ipv4-address"),
        ("::FFFF:c000:207", "192.0.2.7", "ipv4-address"),
        ("::ffff:192.0.2.0/120", "192.0.2.0/24", "ipv4-cidr"),
        ("::ffff:0:0/96", "0.0.0.0/0", "ipv4-cidr"),
        ("::ffff:192.0.2.7/128", "192.0.2.7/32", "ipv4-cidr"),
    ],
)
def test_v4_mapped_targets_become_ipv4(raw: str, host: str, kind: str) -> None:
    target = NetworkPolicy.denylist({"host": raw}).denied_hosts[0]
    assert (target.host, target.entry_type.value) == (host, kind)
    # A block that only contains the mapped range is IPv6 space the user named.
    assert NetworkPolicy.denylist("::/64").denied_hosts[0].host == "::/64"


def test_denied_v4_mapped_address_renders_ipv4_rules() -> None:
    mapped = NetworkPolicy.denylist("[::ffff:192.0.2.7]:22", "::ffff:198.51.100.0/120")
    plain = NetworkPolicy.denylist("192.0.2.7:22", "198.51.100.0/24")
    assert mapped == plain
    payload = render_iptables(mapped, Resolution())
    assert payload == render_iptables(plain, Resolution())
    v4 = payload.ipv4.splitlines()
    assert "-A CORRAL-EGRESS -d 198.51.100.0/24 -p tcp -j REJECT --reject-with tcp-reset" in v4
    assert (
        "-A CORRAL-EGRESS -d 192.0.2.7/32 -p tcp --dport 22 -j REJECT --reject-with tcp-reset" in v4
    )
    assert "ffff" not in payload.ipv6 and "192.0.2" not in payload.ipv6


def _hostile_resolution(construct: bool) -> Resolution:
    """Addresses with zone ids, as a sandbox's resolver may answer them."""
    fields: dict[str, Any] = {
        "addresses": {
            "api.example.com": (
                ipaddress.IPv6Address(f"2001:db8::5%x\n{INJECTED}"),
                ipaddress.IPv4Address("203.0.113.9"),
            )
        },
        "dns_servers": (ipaddress.IPv6Address(f"fd00::53%eth0 {INJECTED}"),),
        "names": SETS,
    }
    # model_construct skips validation: the renderers must not rely on it.
    return Resolution.model_construct(**fields) if construct else Resolution(**fields)


def test_resolved_addresses_lose_zone_ids_and_mapping() -> None:
    resolved = Resolution(
        addresses={
            "api.example.com": (
                ipaddress.IPv6Address(f"2001:db8::5%x\n{INJECTED}"),
                ipaddress.IPv6Address("::ffff:203.0.113.9"),
            )
        },
        dns_servers=(ipaddress.IPv6Address(f"fd00::53%eth0 {INJECTED}"),),
        names=SETS,
    )
    assert [str(a) for a in resolved.addresses["api.example.com"]] == [
        "2001:db8::5",
        "203.0.113.9",
    ]
    assert [str(a) for a in resolved.dns_servers] == ["fd00::53"]
    v4 = render_iptables(NetworkPolicy.allowlist("api.example.com"), resolved).ipv4
    assert "-A CORRAL-EGRESS -d 203.0.113.9/32 -j ACCEPT" in v4.splitlines()


@pytest.mark.parametrize("construct", [False, True], ids=["validated", "unvalidated"])
@pytest.mark.parametrize(
    "policy",
    [
        NetworkPolicy.allowlist("api.example.com:443"),
        NetworkPolicy.denylist("api.example.com"),
        NetworkPolicy.no_network(),
        NetworkPolicy.public(),
    ],
    ids=str,
)
def test_no_resolved_text_reaches_a_payload(policy: NetworkPolicy, construct: bool) -> None:
    clean = Resolution(
        addresses={
            "api.example.com": (
                ipaddress.ip_address("2001:db8::5"),
                ipaddress.ip_address("203.0.113.9"),
            )
        },
        dns_servers=(ipaddress.ip_address("fd00::53"),),
        names=SETS,
    )
    rendered = _render_all(policy, _hostile_resolution(construct))
    assert "%" not in rendered
    assert rendered == _render_all(policy, clean)
