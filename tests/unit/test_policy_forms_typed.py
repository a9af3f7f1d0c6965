"""The documented string forms of a schedule are accepted by the type checker (pyright
strict runs over this file in CI) and parse to the policies they name."""

from __future__ import annotations

from corral import NetworkPolicy, NetworkSchedule


def test_string_and_mapping_policies_type_check_and_parse() -> None:
    schedule = NetworkSchedule(
        baseline="public",
        run="allowlist:api.example.com:443",
        evaluation={"network_mode": "no-network"},
    )
    assert schedule.baseline == NetworkPolicy.public()
    assert schedule.run == NetworkPolicy.allowlist("api.example.com:443")
    assert schedule.evaluation == NetworkPolicy.no_network()
    assert schedule.evaluation_baseline == NetworkPolicy.public()
