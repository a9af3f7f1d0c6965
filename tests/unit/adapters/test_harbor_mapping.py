"""The Harbor adapter's pure mapping (no Harbor needed), and its import without Harbor.

Harbor's `NetworkPolicy` is stood in for by a pydantic model with the same two fields;
the real package runs on Docker in tests/integration/adapters/test_harbor.py.
"""

from __future__ import annotations

from enum import StrEnum
from importlib.util import find_spec

import pytest
from pydantic import BaseModel, ValidationError

import corral.adapters.harbor as adapter
from corral import ExecResult
from corral.adapters.harbor.config import HarborEnvironmentConfig
from corral.adapters.harbor.mapping import (
    capability_flags,
    corral_policy,
    corral_schedule,
    ends_phase,
    exec_fields,
    shell_command,
)
from corral.core.environment import ENVIRONMENTS
from corral.network import NetworkPolicy


class HarborMode(StrEnum):
    """Stand-in of Harbor's NetworkMode (harbor.models.task.config)."""

    NO_NETWORK = "no-network"
    PUBLIC = "public"
    ALLOWLIST = "allowlist"


class HarborPolicy(BaseModel):
    """Stand-in of Harbor's NetworkPolicy: the same fields and values."""

    network_mode: HarborMode = HarborMode.PUBLIC
    allowed_hosts: list[str] = []


def test_import_follows_whether_harbor_is_installed() -> None:
    # tests/run.sh runs the unit tests on 3.11 (without it) and on 3.12 (with it).
    if find_spec("harbor") is None:
        assert adapter.UNAVAILABLE is not None and "3.12" in adapter.UNAVAILABLE
        with pytest.raises(ImportError, match="Harbor is not installed"):
            _ = adapter.CorralEnvironment
    else:
        assert adapter.UNAVAILABLE is None
        assert adapter.CorralEnvironment.type() == "corral"


def test_policies_keep_their_modes_and_entries() -> None:
    assert corral_policy(HarborPolicy()) == NetworkPolicy.public()
    assert corral_policy(HarborPolicy(network_mode=HarborMode.NO_NETWORK)) == (
        NetworkPolicy.no_network()
    )
    hosts = ["api.example.com", "192.0.2.1", "2001:db8::1", "10.0.0.0/8", "2001:db8::/32"]
    mapped = corral_policy(HarborPolicy(network_mode=HarborMode.ALLOWLIST, allowed_hosts=hosts))
    assert mapped == NetworkPolicy.allowlist(*hosts)
    assert [t.entry_type.value for t in mapped.allowed_hosts] == [
        "hostname",
        "ipv4-address",
        "ipv6-address",
        "ipv4-cidr",
        "ipv6-cidr",
    ]


def test_schedule_baseline_then_agent_then_verifier() -> None:
    agent = HarborPolicy(network_mode=HarborMode.ALLOWLIST, allowed_hosts=["a.example.com"])
    verifier = HarborPolicy(network_mode=HarborMode.NO_NETWORK)
    schedule = corral_schedule(HarborPolicy(), [agent, verifier])
    assert schedule.baseline == NetworkPolicy.public()
    assert schedule.run == NetworkPolicy.allowlist("a.example.com")
    assert schedule.evaluation == NetworkPolicy.no_network()
    alone = corral_schedule(verifier, [])
    assert alone.run == alone.evaluation == NetworkPolicy.no_network()


@pytest.mark.usefixtures("helper_shipped")
def test_capabilities_are_what_the_provider_enforces() -> None:
    docker = capability_flags(ENVIRONMENTS.get("docker"))
    assert docker["disable_internet"] and docker["network_allowlist"]
    assert docker["dynamic_network_policy"]
    # Docker enforces wildcards through corral's resolver in the holder; Kubernetes cannot.
    assert docker["network_allowlist_wildcard_hostnames"]
    for kind in ("hostnames", "ipv4_addresses", "ipv6_addresses", "ipv4_cidrs", "ipv6_cidrs"):
        assert docker[f"network_allowlist_{kind}"], kind
    local = capability_flags(ENVIRONMENTS.get("local"))
    assert not local["network_allowlist"]
    assert not any(v for k, v in local.items() if k.startswith("network_allowlist_"))


def test_every_switch_but_into_the_agent_phase_ends_the_workload() -> None:
    agent = NetworkPolicy.allowlist("a.example.com")
    assert not ends_phase(agent, agent)
    assert ends_phase(NetworkPolicy.public(), agent)
    assert ends_phase(NetworkPolicy.no_network(), agent)
    assert ends_phase(agent, None)


def test_exec_runs_through_bash_and_maps_results() -> None:
    assert shell_command("echo hi") == ["bash", "-c", "echo hi"]
    done = ExecResult(returncode=2, stdout="out", stderr="", duration_s=0.1)
    assert exec_fields(done, None) == {"stdout": "out", "stderr": None, "return_code": 2}
    late = ExecResult(returncode=124, stdout="", stderr="", timed_out=True, duration_s=1.0)
    with pytest.raises(RuntimeError, match="timed out after 1 seconds"):
        exec_fields(late, 1)


def test_config_is_strict_and_owned_by_harbor() -> None:
    config = HarborEnvironmentConfig.model_validate({"provider_config": {"pull_policy": "never"}})
    assert config.provider == "docker"
    assert config.provider_params() == {"owner": "harbor", "pull_policy": "never"}
    with pytest.raises(ValidationError):
        HarborEnvironmentConfig.model_validate({"provder": "docker"})
    with pytest.raises(ValidationError):
        config.provider = "k8s"  # frozen


def test_a_provider_on_the_hosts_filesystem_is_refused_at_configuration() -> None:
    # Harbor's fixed paths (/logs/agent, /tests, ...) would be the host's own.
    with pytest.raises(ValidationError, match="use docker or k8s") as refused:
        HarborEnvironmentConfig.model_validate({"provider": "local"})
    assert "provider 'local' runs commands on the host's filesystem" in str(refused.value)
    assert HarborEnvironmentConfig.model_validate({"provider": "k8s"}).provider == "k8s"


def test_a_routed_variable_is_its_routes_url_and_a_withheld_one_holds_no_key() -> None:
    from corral.adapters.credential_env import WITHHELD
    from corral.adapters.harbor.config import HarborEnvironmentConfig

    route = {"upstream": "https://api.example.com/v1", "headers": {"Authorization": "k"}}
    options = HarborEnvironmentConfig.model_validate(
        {
            "credentials": {"model": route},
            "credential_env": {"OPENAI_BASE_URL": "model"},
            "withhold_env": ["OPENAI_API_KEY"],
        }
    )
    given = {"OPENAI_API_KEY": "sk-real", "OTHER": "x", "OPENAI_BASE_URL": "https://leak"}
    routed = options.routed(given, {"model": "http://10.0.0.1:9/t/model"})
    assert routed == {
        "OPENAI_API_KEY": WITHHELD,
        "OTHER": "x",
        "OPENAI_BASE_URL": "http://10.0.0.1:9/t/model",
    }
    assert "sk-real" not in repr(options)
    with pytest.raises(ValueError, match="names route 'nope'"):
        HarborEnvironmentConfig.model_validate(
            {"credentials": {"model": route}, "credential_env": {"X_URL": "nope"}}
        )
