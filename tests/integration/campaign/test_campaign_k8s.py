"""The cancellation campaign against a real Kubernetes cluster, through the public API.

Pods and NetworkPolicies are counted by the run's owner label in the test namespace; the
egress targets are host listeners on this run's veth addresses, which Pods reach through
the node.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral import ExecutionPlan, NetworkPolicy, NetworkSchedule
from corral.core.labels import OWNER
from corral.testing.campaign import OPERATIONS, Subject, run_campaign
from corral.testing.plugin import ConnectCommand
from tests.integration.campaign.conftest import check, max_n, two_targets
from tests.integration.conftest import ALLOWED_IP, DENIED_IP
from tests.integration.k8s.conftest import TEST_IMAGE, make_env

pytestmark = [pytest.mark.anyio, pytest.mark.k8s]


def _labelled(cluster: Any, namespace: str, owner: str) -> frozenset[str]:
    selector = f"{OWNER}={owner}"
    pods: Any = cluster.core.list_namespaced_pod(namespace, label_selector=selector)
    policies: Any = cluster.networking.list_namespaced_network_policy(
        namespace, label_selector=selector
    )
    return frozenset(
        [f"pod/{p.metadata.name}" for p in pods.items]
        + [f"networkpolicy/{p.metadata.name}" for p in policies.items]
    )


@pytest.fixture
def subject(
    cluster: Any,
    namespace: str,
    target_link: None,
    scratch: Path,
    corral_connect_command: ConnectCommand,
) -> Iterator[Subject]:
    mine = f"corral-campaign-{secrets.token_hex(3)}"
    with two_targets(ALLOWED_IP, DENIED_IP) as (first, second):
        switch = (NetworkPolicy.allowlist(str(first)), NetworkPolicy.allowlist(str(second)))
        yield Subject(
            provider="k8s",
            env=make_env(namespace, owner=mine),
            plan=ExecutionPlan(image=TEST_IMAGE, network=NetworkSchedule(baseline=switch[0])),
            owned=lambda: _labelled(cluster, namespace, mine),
            targets=(first, second),
            switch=switch,
            connect=corral_connect_command,
            scratch=scratch,
            max_n=max_n(),
        )


@pytest.mark.parametrize("operation", OPERATIONS)
async def test_cancelled_at_every_checkpoint_leaves_nothing(
    subject: Subject, operation: str
) -> None:
    check(await run_campaign(subject, operation))
