"""Things dying under a session. The sandbox container killed while an exec runs: the
exec ends within seconds, `close` cleans up, and the session runs no other command. The
holder killed: the policy stays in force (its rules live in the namespace the sandbox
keeps), and the next switch fails closed."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from corral import ExecutionPlan, NetworkPolicy, NetworkSchedule
from corral.errors import CorralError
from corral.providers.docker import DockerEnvironment
from corral.providers.docker.session import DockerSession
from corral.testing.plugin import EgressTarget
from tests.integration.conftest import ALLOWED_IP, TCP_PORT
from tests.integration.disrupt import exec_while
from tests.integration.docker.conftest import TEST_IMAGE, leftovers

pytestmark = pytest.mark.anyio

PLAN = ExecutionPlan(image=TEST_IMAGE, network=NetworkSchedule(baseline=NetworkPolicy.no_network()))


async def test_sandbox_killed_mid_exec(
    engine: Any, owner: str, docker_env: DockerEnvironment
) -> None:
    session = await docker_env.open(PLAN)
    assert isinstance(session, DockerSession)
    try:
        outcome, took = await exec_while(session, lambda: engine.api.kill(session.sandbox))
        assert took < 15, outcome
        # The command did not finish: killed with its container (SIGKILL: 137), or lost.
        assert outcome != "returned 0", outcome
        with pytest.raises(CorralError):
            await session.exec(["true"])
    finally:
        await docker_env.close(session)
    assert leftovers(engine, owner) == []


async def test_holder_killed_mid_session(
    engine: Any, owner: str, docker_env: DockerEnvironment, tcp_targets: list[EgressTarget]
) -> None:
    session = await docker_env.open(PLAN)
    assert isinstance(session, DockerSession)
    try:
        await anyio.to_thread.run_sync(engine.api.kill, session.net.holder)
        # The rules live in the namespace, which the sandbox keeps: still no network.
        dial = await session.exec(["nc", "-z", "-w", "3", ALLOWED_IP, str(TCP_PORT)])
        assert dial.returncode != 0, dial
        # Nothing can change or check the rules now: the switch fails closed.
        with anyio.fail_after(30):
            with pytest.raises(CorralError):
                await session.set_network_policy(NetworkPolicy.public())
        assert session.closed
        with pytest.raises(CorralError):
            await session.exec(["true"])
    finally:
        await docker_env.close(session)
    assert leftovers(engine, owner) == []
