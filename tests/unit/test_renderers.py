"""Golden-file tests of the two pure renderers. Regenerate with CORRAL_UPDATE_GOLDEN=1."""

from __future__ import annotations

import ipaddress
import json
import os
import re
from pathlib import Path

import pytest

from corral import NetworkPolicy
from corral.errors import NetworkPolicyUnsupported
from corral.network import Phase, Resolution, render_iptables, render_network_policy
from corral.network.events import LOG_BURST, LOG_RATE_PER_S, NFLOG_GROUP, log_prefix
from corral.network.wildcard import NameSets

GOLDEN = Path(__file__).parent / "golden"

RESOLVED = Resolution(
    addresses={
        "api.example.com": (
            ipaddress.ip_address("203.0.113.10"),
            ipaddress.ip_address("2001:db8::10"),
        ),
        "blocked.example.com": (ipaddress.ip_address("198.51.100.7"),),
    },
    dns_servers=(ipaddress.ip_address("127.0.0.11"), ipaddress.ip_address("10.96.0.10")),
)

#: Docker renders an allowlist that names a host with corral's resolver's sets; the other
#: policies ignore them (and the NetworkPolicy renderer never reads them).
WITH_SETS = RESOLVED.model_copy(
    update={
        "names": NameSets(
            generation="0badcafe", upstream=(ipaddress.ip_address("10.96.0.10"),), connmark=0x1234
        )
    }
)

CASES = {
    "public": NetworkPolicy.public(),
    "no-network": NetworkPolicy.no_network(),
    "allowlist": NetworkPolicy.allowlist(
        "api.example.com:443", "10.20.0.0/16", "[2001:db8::53]:53"
    ),
    "allowlist-addresses-only": NetworkPolicy.allowlist("192.0.2.1"),
    "denylist": NetworkPolicy.denylist("blocked.example.com", "192.0.2.0/24:22", "2001:db8::/32"),
}


def _check(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("CORRAL_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with CORRAL_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from its golden file"


@pytest.mark.parametrize("case", sorted(CASES))
def test_iptables_golden(case: str) -> None:
    payload = render_iptables(CASES[case], WITH_SETS)
    _check(f"{case}.iptables", payload.ipv4)
    _check(f"{case}.ip6tables", payload.ipv6)
    _check(f"{case}.nat", payload.nat4)


def test_iptables_golden_logs_with_the_phase() -> None:
    payload = render_iptables(CASES["denylist"], WITH_SETS, phase="run")
    _check("denylist-run.iptables", payload.ipv4)
    _check("denylist-run.ip6tables", payload.ipv6)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("phase", [None, "baseline", "evaluation_baseline"])
def test_every_reject_is_logged_first_with_the_same_match(case: str, phase: Phase | None) -> None:
    """Each REJECT has, right before it, one rate-limited NFLOG rule matching exactly what
    it matches, stamped with the phase; each rule that admits a flow has one for new flows
    only, stamped `:allowed`; nothing else is logged."""
    payload = render_iptables(CASES[case], WITH_SETS, phase=phase)
    limit = f"-m limit --limit {LOG_RATE_PER_S}/second --limit-burst {LOG_BURST}"
    for text in (payload.ipv4, payload.ipv6):
        lines = text.splitlines()
        rejects = [i for i, line in enumerate(lines) if " -j REJECT " in line]
        logs = [i for i, line in enumerate(lines) if " -j NFLOG " in line]
        admits = [i for i in logs if i + 1 not in rejects]
        assert sorted([i - 1 for i in rejects] + admits) == logs
        for i in rejects:
            match = lines[i].partition("-j REJECT ")[0]
            assert lines[i - 1] == (
                f"{match}{limit} -j NFLOG --nflog-group {NFLOG_GROUP} --nflog-prefix "
                f"{log_prefix(phase)} --nflog-size 128"
            )
        for i in admits:
            match, action, _ = lines[i + 1].partition("-j ")
            assert action and lines[i + 1].endswith(("-j ACCEPT", "--set-mark 0x1234")), lines[
                i + 1
            ]
            assert lines[i] == (
                f"{match}-m conntrack --ctstate NEW {limit} -j NFLOG --nflog-group "
                f"{NFLOG_GROUP} --nflog-prefix {log_prefix(phase, 'allowed')} --nflog-size 128"
            )
        if case == "public":
            assert not rejects and len(admits) == 1
        if case == "no-network":
            assert not admits


def test_a_phase_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError, match="not a phase"):
        render_iptables(CASES["no-network"], RESOLVED, phase="run; -j ACCEPT")  # type: ignore[arg-type]


@pytest.mark.parametrize("case", sorted(CASES))
def test_network_policy_golden(case: str) -> None:
    manifest = render_network_policy(
        CASES[case], RESOLVED, {"corral.session": "abc123def456"}, name="corral-abc123def456"
    )
    _check(f"{case}.networkpolicy.json", json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def test_no_network_closes_the_embedded_resolver() -> None:
    v4 = render_iptables(NetworkPolicy.no_network(), RESOLVED).ipv4
    lines = v4.splitlines()
    reject_dns = lines.index(
        "-A CORRAL-EGRESS -d 127.0.0.11/32 -j REJECT --reject-with icmp-port-unreachable"
    )
    assert reject_dns < lines.index("-A CORRAL-EGRESS -o lo -j ACCEPT")
    assert lines[-2:] == [
        "-A CORRAL-EGRESS -j REJECT --reject-with icmp-port-unreachable",
        "COMMIT",
    ]


def test_unresolved_hostname_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"'other\.example\.com' was not resolved"):
        render_iptables(NetworkPolicy.allowlist("other.example.com"), WITH_SETS)
    # An allowlist naming hosts is rendered only with the sets of its apply
    # (tests/unit/test_wildcard.py).
    for name in ("*.example.com", "api.example.com"):
        with pytest.raises(ValueError, match=rf"{re.escape(name)} names hosts"):
            render_iptables(NetworkPolicy.allowlist(name), RESOLVED)
    with pytest.raises(NetworkPolicyUnsupported, match=r"\*\.example\.com"):
        render_iptables(NetworkPolicy.denylist("*.example.com"), RESOLVED)


def test_an_endpoint_of_corrals_is_admitted_first_in_every_mode() -> None:
    gateway = ipaddress.ip_address("10.213.0.1")
    for case, policy in CASES.items():
        payload = render_iptables(policy, WITH_SETS, phase="run", endpoints=((gateway, 41234),))
        chain = [line for line in payload.ipv4.splitlines() if line.startswith("-A CORRAL-EGRESS")]
        accept = "-A CORRAL-EGRESS -d 10.213.0.1/32 -p tcp --dport 41234 -j ACCEPT"
        assert chain.index(accept) == 2, case  # after replies, and its own NEW-flow log
        assert "--nflog-prefix corral:run:allowed" in chain[1], case
        assert "41234" not in payload.ipv6, "an IPv4 endpoint stays out of the IPv6 rules"
