"""Processes on a real engine, seen from outside the sandbox: what `end_workload()` and
`close()` leave is read from the engine's own view of the container (`top`), which
nothing inside can change. The behaviour itself is the conformance suite's
(`corral.testing.processes`, in test_docker_conformance.py)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from corral import ExecutionPlan, FeatureUnsupported, PtySize
from corral.core.labels import OWNER
from corral.providers.docker import DockerEnvironment
from corral.providers.docker.session import DockerSession
from tests.integration.docker.conftest import TEST_IMAGE

pytestmark = pytest.mark.anyio


def _commands(engine: Any, container: str) -> list[str]:
    top: dict[str, Any] = engine.api.top(container)
    column = top["Titles"].index("CMD")
    rows: list[list[str]] = top.get("Processes") or []
    return [row[column] for row in rows]


async def test_what_end_workload_and_close_leave_is_nothing_of_theirs(
    engine: Any, owner: str, docker_env: DockerEnvironment
) -> None:
    async with docker_env.session(ExecutionPlan(image=TEST_IMAGE)) as sandbox:
        assert isinstance(sandbox, DockerSession)
        await sandbox.start(["sh", "-c", "setsid sleep 3301 & sleep 3302"])
        term = await sandbox.start(["sh"], pty=PtySize())
        await term.write("sleep 3303\n")
        async with await sandbox.shell() as shell:
            busy = await shell.run("sleep 3304 &")
            await anyio.sleep(0.5)
            before = _commands(engine, sandbox.sandbox)
            await sandbox.end_workload()
            after = _commands(engine, sandbox.sandbox)
        await sandbox.start(["sleep", "3305"])
        container = sandbox.sandbox
    assert busy.returncode == 0
    assert {f"sleep {n}" for n in range(3301, 3305)} <= {c.strip() for c in before}, before
    assert not [c for c in after if "sleep 33" in c or "--procs" in c], after
    assert engine.api.containers(all=True, filters={"id": container}) == []
    assert engine.api.containers(all=True, filters={"label": f"{OWNER}={owner}"}) == []


async def test_end_workload_cannot_lose_the_sandbox(
    engine: Any, docker_env: DockerEnvironment
) -> None:
    # Engine 20.10 restarts an auto-remove container by clearing the flag around the stop
    # and setting it back unlocked; the exit handler reads it after that now and then and
    # removes the container ("container is marked for removal", seen in CI). Every
    # end_workload restarts the sandbox, so it is never auto-removed.
    async with docker_env.session(ExecutionPlan(image=TEST_IMAGE)) as sandbox:
        assert isinstance(sandbox, DockerSession)
        for _ in range(3):
            await sandbox.end_workload()
            info: dict[str, Any] = engine.api.inspect_container(sandbox.sandbox)
            assert info["State"]["Running"], info["State"]
            assert info["HostConfig"]["AutoRemove"] is False


SQUAT = (
    "import socket, sys, time\n"
    "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
    "s.bind('\\0corral-procs-' + sys.argv[1]); s.listen(8); print('bound', flush=True)\n"
    "while True:\n"
    "    c, _ = s.accept(); c.sendall(b'forged'); c.close()\n"
)


async def test_a_workload_that_holds_the_managers_address_is_never_talked_to(
    docker_env: DockerEnvironment,
) -> None:
    """A workload that is not root binds the process manager's address before corral
    starts it: corral refuses processes, naming why, and never reads what it says."""
    async with docker_env.session(ExecutionPlan(image=TEST_IMAGE)) as sandbox:
        hold = 'setsid python3 -c "$0" "$1" </dev/null >/tmp/squat 2>&1 & sleep 1; cat /tmp/squat'
        squatter = await sandbox.exec(["sh", "-c", hold, SQUAT, sandbox.id], user="nobody")
        with pytest.raises(FeatureUnsupported, match="held by uid 65534"):
            await sandbox.start(["echo", "hi"])
    assert squatter.stdout == "bound\n", squatter
