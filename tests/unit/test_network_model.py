from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral import NetworkMode, NetworkPolicy, NetworkSchedule
from corral.errors import NetworkPolicyUnsupported
from corral.network import EntryType, NetworkCapabilities, NetworkTarget


@pytest.mark.parametrize(
    ("raw", "host", "port", "kind"),
    [
        ("Example.COM.", "example.com", None, EntryType.HOSTNAME),
        ("api.example.com:443", "api.example.com", 443, EntryType.HOSTNAME),
        ("*.Example.com", "*.example.com", None, EntryType.WILDCARD_HOSTNAME),
        ("bücher.de", "xn--bcher-kva.de", None, EntryType.HOSTNAME),
        ("10.1.2.3", "10.1.2.3", None, EntryType.IPV4_ADDRESS),
        ("10.1.2.3:8080", "10.1.2.3", 8080, EntryType.IPV4_ADDRESS),
        ("10.0.0.0/8", "10.0.0.0/8", None, EntryType.IPV4_CIDR),
        ("2001:DB8::1", "2001:db8::1", None, EntryType.IPV6_ADDRESS),
        ("[2001:db8::1]:53", "2001:db8::1", 53, EntryType.IPV6_ADDRESS),
        ("2001:db8::/32", "2001:db8::/32", None, EntryType.IPV6_CIDR),
        ({"host": "Example.com", "port": 80}, "example.com", 80, EntryType.HOSTNAME),
    ],
)
def test_targets_normalize(raw: object, host: str, port: int | None, kind: EntryType) -> None:
    target = NetworkTarget.model_validate(raw)
    assert (target.host, target.port, target.entry_type) == (host, port, kind)
    assert NetworkTarget.model_validate(str(target)) == target


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("https://example.com", "is a URL"),
        ("example.com/path", "example.com/path"),
        (" example.com", "whitespace"),
        ("exa mple.com", "whitespace"),
        ("a..b", "a..b"),
        ("", "empty"),
        ("10.0.0.1/8", "host bits"),
        ("example.com:0", "1-65535"),
        ("example.com:65536", "1-65535"),
        ("example.com:http", "1-65535"),
        ("foo.*.com", "leading"),
        ("*.com", "wildcard needs a domain"),
        ("-bad.com", "-bad.com"),
        ("[example.com]:80", "only for IPv6"),
        ("1.2.3", "1.2.3"),
        ({"host": "x.com", "prot": 1}, "'host'"),
    ],
)
def test_bad_targets_name_the_entry(raw: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("*", r"\*").replace(".", r"\.")):
        NetworkTarget.model_validate(raw)


@given(
    st.lists(st.from_regex(r"[a-z][a-z0-9]{0,10}", fullmatch=True), min_size=2, max_size=4),
    st.one_of(st.none(), st.integers(1, 65535)),
)
def test_hostname_round_trip(labels: list[str], port: int | None) -> None:
    text = ".".join(labels) + (f":{port}" if port else "")
    target = NetworkTarget.model_validate(text.upper())
    assert str(target) == text
    assert NetworkTarget.model_validate(str(target)) == target


@given(st.ip_addresses(), st.one_of(st.none(), st.integers(1, 65535)))
def test_address_round_trip(address: object, port: int | None) -> None:
    target = NetworkTarget.model_validate({"host": str(address), "port": port})
    assert NetworkTarget.model_validate(str(target)) == target


def test_policy_forms() -> None:
    assert NetworkPolicy.model_validate("public") == NetworkPolicy.public()
    assert NetworkPolicy.model_validate("no-network") == NetworkPolicy.no_network()
    parsed = NetworkPolicy.model_validate("allowlist:a.com,10.0.0.1:22,a.com")
    assert parsed == NetworkPolicy.allowlist("a.com", "10.0.0.1:22")
    assert [str(t) for t in parsed.allowed_hosts] == ["a.com", "10.0.0.1:22"]
    mapping = {"network_mode": "denylist", "denied_hosts": ["b.com"]}
    assert NetworkPolicy.model_validate(mapping) == NetworkPolicy.denylist("b.com")
    assert NetworkPolicy.model_validate(mapping).model_dump(mode="json") == {
        "network_mode": "denylist",
        "allowed_hosts": [],
        "denied_hosts": ["b.com"],
    }


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("allowlist", "at least one entry in allowed_hosts"),
        ("denylist:", "empty"),
        ("sometimes", "unknown network mode 'sometimes'"),
        ("public:a.com", "takes no targets"),
        ({"network_mode": "public", "allowed_hosts": ["a.com"]}, "only valid in allowlist"),
        ({"network_mode": "allowlist", "denied_hosts": ["a.com"]}, "only valid in denylist"),
        ({"network_mode": "public", "extra": 1}, "extra"),
    ],
)
def test_bad_policies(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NetworkPolicy.model_validate(value)


def test_policy_is_immutable() -> None:
    policy = NetworkPolicy.public()
    with pytest.raises(ValueError, match="frozen"):
        policy.network_mode = NetworkMode.NO_NETWORK  # type: ignore[misc]


def test_schedule_inherits_baseline() -> None:
    schedule = NetworkSchedule.model_validate({"baseline": "no-network", "run": "public"})
    assert schedule.run == NetworkPolicy.public()
    assert schedule.evaluation == schedule.evaluation_baseline == NetworkPolicy.no_network()
    assert NetworkSchedule.model_validate("public").run == NetworkPolicy.public()


DOCKERISH = NetworkCapabilities(
    provider="docker",
    modes=frozenset(NetworkMode),
    entry_types=frozenset(EntryType) - {EntryType.WILDCARD_HOSTNAME},
    target_ports=True,
    dynamic=True,
)


def test_capabilities_fail_closed_naming_phase_and_modes() -> None:
    static = NetworkCapabilities(provider="local", modes=frozenset({NetworkMode.PUBLIC}))
    schedule = NetworkSchedule.model_validate({"baseline": "public", "run": "no-network"})
    with pytest.raises(NetworkPolicyUnsupported, match=r"'run'.*no-network.*supports: public"):
        static.check_schedule(schedule)
    with pytest.raises(NetworkPolicyUnsupported, match=r"\*\.example\.com.*override 'evaluation'"):
        DOCKERISH.check_policy(NetworkPolicy.allowlist("*.example.com"), "evaluation")
    no_ports = DOCKERISH.model_copy(update={"target_ports": False})
    with pytest.raises(NetworkPolicyUnsupported, match="cannot enforce ports"):
        no_ports.check_policy(NetworkPolicy.denylist("a.com:22"), "baseline")
    DOCKERISH.check_schedule(schedule)


def test_static_provider_refuses_schedules_that_switch() -> None:
    both = NetworkCapabilities(
        provider="local", modes=frozenset({NetworkMode.PUBLIC, NetworkMode.NO_NETWORK})
    )
    schedule = NetworkSchedule.model_validate({"baseline": "public", "evaluation": "no-network"})
    with pytest.raises(NetworkPolicyUnsupported, match=r"cannot switch.*'evaluation'"):
        both.check_schedule(schedule)
    both.check_schedule(NetworkSchedule.model_validate("no-network"))
