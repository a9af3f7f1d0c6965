"""`dockerd` restarted under a live session (issue 11: things dying).

The running exec ends with a clear error while the engine is down (it never hangs), the
engine comes back with the session's containers stopped (no restart policy), the
session runs no other command, and `close` removes what is left by exact identity.

Restarting the engine stops every container on it, the egress targets too, so this module
runs in its own pytest process after the main run (`tests/run.sh`; the marker is
deselected by default in pyproject.toml), and only on a dockerd `engine.sh` started.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral import ExecutionPlan, NetworkPolicy, NetworkSchedule
from corral.errors import CorralError
from corral.providers.docker import DockerEnvironment
from corral.providers.docker.session import DockerSession
from tests.integration.conftest import unavailable
from tests.integration.docker.conftest import TEST_IMAGE, leftovers

pytestmark = [pytest.mark.anyio, pytest.mark.engine_restart]

ENGINE_SH = Path(__file__).with_name("engine.sh")
PLAN = ExecutionPlan(image=TEST_IMAGE, network=NetworkSchedule(baseline=NetworkPolicy.no_network()))


def _restart_engine() -> float:
    """Restart dockerd; returns the monotonic time the restart began."""
    began = time.monotonic()
    done = subprocess.run(["bash", str(ENGINE_SH), "restart"], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"engine.sh restart failed: {done.stderr[-2000:]}")
    return began


async def test_engine_restart_mid_exec(
    engine: Any, owner: str, docker_env: DockerEnvironment
) -> None:
    status = await anyio.run_process(["bash", str(ENGINE_SH), "status"], check=False)
    if b"engine.sh, pid" not in status.stdout:
        unavailable(
            "this test restarts dockerd: start it with tests/integration/docker/engine.sh up"
        )
    session = await docker_env.open(PLAN)
    assert isinstance(session, DockerSession)
    ended: dict[str, Any] = {}
    began = 0.0
    try:

        async def exec_sleep() -> None:
            try:
                result = await session.exec(["sleep", "120"])
                ended["outcome"] = f"returned {result.returncode}"
            except CorralError as exc:
                ended["outcome"] = f"raised {type(exc).__name__}: {exc}"
            ended["at"] = time.monotonic()

        async with anyio.create_task_group() as group:
            group.start_soon(exec_sleep)
            await anyio.sleep(1)
            with anyio.fail_after(120):
                began = await anyio.to_thread.run_sync(_restart_engine)
        # The exec ended once the engine went away, not when the engine came back.
        assert ended["outcome"].startswith("raised"), ended
        assert ended["at"] - began < 15, ended
        with pytest.raises(CorralError):
            await session.exec(["true"])
    finally:
        await docker_env.close(session)
    assert leftovers(engine, owner) == []
