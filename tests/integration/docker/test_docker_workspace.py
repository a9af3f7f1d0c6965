"""Workspace bindings on a real Docker Engine (scenarios in tests/integration/workspace_cases)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral import EnvironmentSession, ExecutionPlan, NetworkSchedule, TaskRun
from corral.providers.docker import DockerEnvironment
from corral.workspace import SyncBinding
from tests.integration import workspace_cases as cases
from tests.integration.docker.conftest import TEST_IMAGE
from tests.workspaces import sh, tree, write_tree

pytestmark = pytest.mark.anyio

PLAN = ExecutionPlan(image=TEST_IMAGE, workdir="/tmp")


@pytest.mark.parametrize("case", cases.SESSION_CASES, ids=lambda case: case.__name__)
async def test_workspace_case(
    docker_env: DockerEnvironment,
    tmp_path: Path,
    case: cases.SessionCase,
) -> None:
    async with docker_env.session(PLAN) as sandbox:
        await case(sandbox, tmp_path)


async def test_task_run_binds_before_the_run_and_syncs_back_after_evaluation(
    docker_env: DockerEnvironment, tmp_path: Path
) -> None:
    """The agent works with no network; the workspace still goes in and comes back."""
    source = write_tree(tmp_path / "src", {"task.txt": "open\n"})
    plan = PLAN.model_copy(
        update={
            "network": NetworkSchedule.model_validate(
                {"run": "no-network", "evaluation": "no-network"}
            )
        }
    )
    binding = SyncBinding(source=source, path="/srv/task")

    async def grade(sandbox: EnvironmentSession) -> str:
        return await sandbox.read_text("/srv/task/task.txt")

    async with TaskRun(docker_env, plan, bindings=[binding]) as run:
        async with run.running() as sandbox:
            await sh(sandbox, "echo solved > /srv/task/task.txt")
        assert tree(source) == {"task.txt": "open\n"}  # not before evaluation
        assert await run.evaluate(grade) == "solved\n"
    (snapshot,) = run.snapshots
    assert snapshot.sync.written == ("task.txt",)
    assert tree(source) == {"task.txt": "solved\n"}
