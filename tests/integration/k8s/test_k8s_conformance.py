"""The conformance suite against the `k8s` provider on a real cluster."""

from __future__ import annotations

import pytest

from corral import BaseEnvironment, ExecutionPlan
from corral.providers.k8s import KubernetesEnvironment
from corral.testing.conformance import *  # noqa: F403
from corral.testing.plugin import EgressTarget
from corral.testing.processes import *  # noqa: F403
from tests.integration.k8s.conftest import TEST_IMAGE


@pytest.fixture
def corral_environment(k8s_env: KubernetesEnvironment) -> BaseEnvironment:
    return k8s_env


@pytest.fixture
def corral_plan() -> ExecutionPlan:
    return ExecutionPlan(image=TEST_IMAGE)


@pytest.fixture
def corral_egress_targets(tcp_targets: list[EgressTarget]) -> list[EgressTarget]:
    return tcp_targets
