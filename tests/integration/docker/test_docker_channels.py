"""The channels between corral's programs and the harness, written by root in a Docker
sandbox (issue 40, items 5 and 6): forged frames on the process relay's stdout, and a
flood of a persistent shell's status pipe while another session execs. The scenarios
are the escape catalogue's (`corral.testing.escapes`), shared with Kubernetes; both
failed on 29fb870 (a forged result; a run that never failed)."""

from __future__ import annotations

import pytest

from corral import ExecutionPlan
from corral.providers.docker import DockerEnvironment
from corral.testing.escapes import flood_the_shell_status, forge_through_the_relay
from tests.integration.docker.conftest import TEST_IMAGE

pytestmark = pytest.mark.anyio

PLAN = ExecutionPlan(image=TEST_IMAGE)


async def test_forged_frames_on_the_relays_stdout_never_reach_a_result(
    routed_env: DockerEnvironment,
) -> None:
    async with routed_env.session(PLAN) as sandbox:
        assert await forge_through_the_relay(sandbox) is None


@pytest.mark.parametrize("newlines", [True, False], ids=["newlines", "no-newline"])
async def test_a_status_flood_fails_the_run_closed_and_other_sessions_do_not_notice(
    routed_env: DockerEnvironment, newlines: bool
) -> None:
    async with routed_env.session(PLAN) as sandbox, routed_env.session(PLAN) as other:
        flood = await flood_the_shell_status(sandbox, other, newlines)
    assert flood.wrong() is None, flood
