"""The conformance suite against the `k8s` provider on a real cluster."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from corral import BaseEnvironment, ExecutionPlan
from corral.providers.k8s import KubernetesEnvironment
from corral.testing import conformance
from corral.testing.conformance import *  # noqa: F403
from corral.testing.plugin import EgressTarget, ServeCommand
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


@pytest.fixture
def crowded_descriptors() -> Iterator[None]:
    """Every descriptor below 1100 taken, as in a harness with a thousand sandboxes open:
    whatever the test opens next is numbered above what `select()` can watch."""
    held: list[int] = []
    while not held or held[-1] < 1100:
        held.append(os.open(os.devnull, os.O_RDONLY))
    yield
    for fd in held:
        os.close(fd)


@pytest.mark.anyio
@pytest.mark.usefixtures("crowded_descriptors")
async def test_an_endpoint_serves_a_harness_with_descriptors_above_1024(
    k8s_env: KubernetesEnvironment, corral_serve_command: ServeCommand
) -> None:
    # The kubernetes client's port-forward proxy select()s: its thread died on
    # "filedescriptor out of range" and the connection hung until the test's deadline.
    await conformance.test_conformance_endpoint(
        k8s_env, ExecutionPlan(image=TEST_IMAGE), corral_serve_command
    )
