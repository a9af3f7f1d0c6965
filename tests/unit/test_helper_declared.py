"""What needs corral's helper is declared only where the installation carries it."""

from __future__ import annotations

from pathlib import Path

import pytest

import corral.helper
from corral import ExecutionPlan, NetworkPolicyUnsupported, NetworkSchedule
from corral.network.targets import EntryType
from corral.providers.docker import DockerEnvironment
from corral.providers.k8s import KubernetesEnvironment
from corral.providers.local import LocalEnvironment


def test_without_the_helper_names_and_events_are_not_offered(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(corral.helper, "BIN_DIR", tmp_path)
    caps = DockerEnvironment.network_capabilities()
    assert EntryType.HOSTNAME not in caps.entry_types
    assert EntryType.WILDCARD_HOSTNAME not in caps.entry_types
    assert EntryType.IPV4_CIDR in caps.entry_types
    assert not DockerEnvironment.features().supports_network_events
    for env in (DockerEnvironment, KubernetesEnvironment, LocalEnvironment):
        features = env.features()
        assert not (features.supports_processes or features.supports_pty), env.id
    plan = ExecutionPlan(network=NetworkSchedule(run="allowlist:api.example.com:443"))
    with pytest.raises(NetworkPolicyUnsupported, match="hostname"):
        DockerEnvironment().prepare(plan)


@pytest.mark.usefixtures("helper_shipped")
def test_with_the_helper_they_are() -> None:
    caps = DockerEnvironment.network_capabilities()
    assert {EntryType.HOSTNAME, EntryType.WILDCARD_HOSTNAME} <= caps.entry_types
    assert DockerEnvironment.features().supports_network_events
    for env in (DockerEnvironment, KubernetesEnvironment):
        assert env.features().supports_processes and env.features().supports_pty
