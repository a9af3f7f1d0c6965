"""The conformance suite against the `docker` provider on a real engine."""

from __future__ import annotations

import pytest

from corral import BaseEnvironment, ExecutionPlan
from corral.providers.docker import DockerEnvironment
from corral.testing.conformance import *  # noqa: F403
from corral.testing.plugin import EgressTarget
from corral.testing.processes import *  # noqa: F403
from tests.integration.docker.conftest import TEST_IMAGE


@pytest.fixture
def corral_environment(docker_env: DockerEnvironment) -> BaseEnvironment:
    return docker_env


@pytest.fixture
def corral_plan() -> ExecutionPlan:
    return ExecutionPlan(image=TEST_IMAGE)


@pytest.fixture
def corral_egress_targets(tcp_targets: list[EgressTarget]) -> list[EgressTarget]:
    return tcp_targets
