"""The channels between corral's programs and the harness, written by root in a Pod
(issue 40, items 6 and 11), under runc and gVisor: the escape catalogue's scenarios
(`corral.testing.escapes`), as in tests/integration/docker/test_docker_channels.py."""

from __future__ import annotations

import pytest

from corral import ExecutionPlan
from corral.providers.k8s import KubernetesEnvironment
from corral.testing.escapes import flood_the_shell_status, forge_through_the_relay
from tests.integration.k8s.conftest import TEST_IMAGE

pytestmark = pytest.mark.anyio

PLAN = ExecutionPlan(image=TEST_IMAGE)


async def test_forged_frames_on_the_relays_stdout_never_reach_a_result(
    runtime_env: KubernetesEnvironment,
) -> None:
    async with runtime_env.session(PLAN) as sandbox:
        assert await forge_through_the_relay(sandbox) is None


@pytest.mark.parametrize("newlines", [True, False], ids=["newlines", "no-newline"])
async def test_a_status_flood_fails_the_run_closed_and_other_sessions_do_not_notice(
    runtime_env: KubernetesEnvironment, newlines: bool
) -> None:
    async with runtime_env.session(PLAN) as sandbox, runtime_env.session(PLAN) as other:
        flood = await flood_the_shell_status(sandbox, other, newlines)
    assert flood.wrong() is None, flood
