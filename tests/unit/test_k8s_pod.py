"""The sandbox Pod's manifest: corral's probe container beside the workload, names the
harness owns, resolvers corral chose."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from pydantic import ValidationError

from corral.core.plan import ExecutionPlan
from corral.providers.k8s.config import KubernetesConfig
from corral.providers.k8s.pod import manifest


def _spec(dns: tuple[str, ...] = (), **config: Any) -> dict[str, Any]:
    cfg = KubernetesConfig.model_validate(config)
    servers = tuple(ipaddress.ip_address(s) for s in dns)
    pod = manifest("corral-x", "img:1", ExecutionPlan(image="img:1"), cfg, {}, servers)
    return pod["spec"]


def test_the_probe_container_shares_only_the_network() -> None:
    spec = _spec(probe_image="probe:1")
    sandbox, prober = spec["containers"]
    assert (sandbox["name"], prober["name"], prober["image"]) == (
        "sandbox",
        "corral-probe",
        "probe:1",
    )
    security = prober["securityContext"]
    assert security["runAsNonRoot"] and security["readOnlyRootFilesystem"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "volumeMounts" not in prober and "shareProcessNamespace" not in spec


def test_names_and_resolvers_come_from_the_config() -> None:
    spec = _spec(("10.96.0.10",), host_aliases={"A.Example.": "10.0.0.1", "b.example": "10.0.0.1"})
    assert spec["hostAliases"] == [{"ip": "10.0.0.1", "hostnames": ["a.example", "b.example"]}]
    assert (spec["dnsPolicy"], spec["dnsConfig"]) == ("None", {"nameservers": ["10.96.0.10"]})
    assert "dnsPolicy" not in _spec()


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"host_aliases": {"api.example": "api.other"}}, "api.other"),
        ({"host_aliases": {"10.0.0.1": "10.0.0.2"}}, "10.0.0.1"),
        ({"dns_servers": ["10.0.0.1", "resolver.example"]}, "resolver.example"),
        ({"dns_servers": ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]}, "more than the 3"),
    ],
)
def test_bad_names_config_is_refused_naming_the_value(config: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        KubernetesConfig.model_validate(config)
