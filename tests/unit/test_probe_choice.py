"""Which destinations show that a switch was taken: `forbidden_probe` and `narrowed`."""

from __future__ import annotations

import ipaddress

from corral import NetworkPolicy
from corral.network import Resolution
from corral.network.probe import NARROWED_LIMIT, forbidden_probe, narrowed

NODE = (ipaddress.ip_address("10.0.0.1"), 10250)
SERVER = ipaddress.ip_address("10.244.0.7")
NONE = Resolution()


def test_an_allowlist_narrowed_to_no_network_is_probed_where_it_let_through() -> None:
    before = NetworkPolicy.allowlist(f"{SERVER}:9000")
    after = NetworkPolicy.no_network()
    # the node's port was refused before the switch too: it alone proves nothing
    assert forbidden_probe(after, NONE, [NODE]) == NODE
    assert forbidden_probe(before, NONE, [NODE]) == NODE
    assert narrowed(before, NONE, after, NONE) == [(SERVER, 9000)]


def test_what_the_new_policy_still_allows_is_not_a_probe() -> None:
    before = NetworkPolicy.allowlist(f"{SERVER}:9000", "10.9.0.0/24:22")
    after = NetworkPolicy.allowlist(f"{SERVER}:9000")
    assert narrowed(before, NONE, after, NONE) == [(ipaddress.ip_address("10.9.0.1"), 22)]
    assert narrowed(after, NONE, before, NONE) == []


def test_an_address_without_a_port_names_nothing_known_to_answer() -> None:
    # corral's own DNS-only step (resolvers, every port) is one of these
    before = NetworkPolicy.allowlist("10.96.0.10", "10.9.0.0/24")
    assert narrowed(before, NONE, NetworkPolicy.no_network(), NONE) == []


def test_names_are_probed_at_the_addresses_they_resolved_to() -> None:
    resolved = Resolution(addresses={"pypi.test": (SERVER,)})
    before = NetworkPolicy.allowlist("pypi.test:8443")
    assert narrowed(before, resolved, NetworkPolicy.no_network(), NONE) == [(SERVER, 8443)]
    # a name without a port on the ports named hosts most often answer on
    before = NetworkPolicy.allowlist("pypi.test")
    assert narrowed(before, resolved, NetworkPolicy.no_network(), NONE) == [
        (SERVER, 443),
        (SERVER, 80),
    ]


def test_after_public_or_a_denylist_the_candidates_suffice() -> None:
    after = NetworkPolicy.no_network()
    for before in (NetworkPolicy.public(), NetworkPolicy.denylist(f"{SERVER}")):
        assert narrowed(before, NONE, after, NONE) == []


def test_at_most_the_limit_is_dialled() -> None:
    before = NetworkPolicy.allowlist(*(f"10.8.0.{n}:22" for n in range(1, 20)))
    taken = narrowed(before, NONE, NetworkPolicy.no_network(), NONE)
    assert len(taken) == NARROWED_LIMIT
    assert taken[0] == (ipaddress.ip_address("10.8.0.1"), 22)
