"""TaskRun binds before the run and finalizes after evaluation; a failed block finalizes
with outcome "failed", a cancelled one abandons, a failed bind releases what was bound."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from corral import ENVIRONMENTS, EnvironmentSession, ExecutionPlan, NetworkSchedule, TaskRun
from corral.workspace import SyncBinding
from tests.unit.fakes import FakeEnvironment
from tests.workspaces import sh, tree, write_tree

pytestmark = pytest.mark.anyio

PLAN = ExecutionPlan(network=NetworkSchedule(baseline="public", run="no-network"))  # type: ignore[arg-type]


class Recording:
    """A binding that logs what TaskRun asks of it, with the policy then in force."""

    def __init__(self, name: str, log: list[str], *, fail: str = "") -> None:
        self.name = name
        self.log = log
        self.fail = fail

    async def bind(self, session: EnvironmentSession, *, path: str | None = None) -> str:
        self.log.append(f"bind {self.name} {session.policy.network_mode.value}")
        if self.fail == "bind":
            raise RuntimeError(f"bind {self.name}")
        return self.name

    async def finalize(self, bound: Any, *, outcome: str | None = None) -> str:
        self.log.append(f"finalize {bound} {outcome}")
        if self.fail == "finalize":
            raise RuntimeError(f"finalize {bound}")
        return f"snapshot {bound}"

    def abandon(self, bound: Any) -> bool:
        self.log.append(f"abandon {bound}")
        return True


async def test_bind_before_the_run_finalize_after_evaluation() -> None:
    log: list[str] = []
    env = FakeEnvironment()

    async def grade(session: EnvironmentSession) -> None:
        log.append("evaluate")

    async with TaskRun(env, PLAN, bindings=[Recording("a", log), Recording("b", log)]) as run:
        assert run.workspaces == ["a", "b"]
        async with run.running():
            log.append("run")
        await run.evaluate(grade)
    assert log == [
        "bind a public",
        "bind b public",
        "run",
        "evaluate",
        "finalize a completed",
        "finalize b completed",
    ]
    assert run.snapshots == ["snapshot a", "snapshot b"]
    assert env.live == set()


async def test_a_failed_block_finalizes_as_failed_and_keeps_its_error() -> None:
    log: list[str] = []
    bindings = [Recording("a", log, fail="finalize"), Recording("b", log)]
    with pytest.raises(ValueError, match="the agent failed") as failure:
        async with TaskRun(FakeEnvironment(), PLAN, bindings=bindings):
            raise ValueError("the agent failed")
    assert log[2:] == ["finalize a failed", "abandon a", "finalize b failed"]
    assert "finalizing the workspaces failed too" in str(failure.value.__notes__)


async def test_finalize_failures_are_raised_after_every_binding_was_tried() -> None:
    log: list[str] = []
    env = FakeEnvironment()
    bindings = [Recording("a", log, fail="finalize"), Recording("b", log, fail="finalize")]
    with pytest.raises(RuntimeError, match="finalize a") as failure:
        async with TaskRun(env, PLAN, bindings=bindings):
            pass
    assert log[2:] == ["finalize a completed", "abandon a", "finalize b completed", "abandon b"]
    assert "finalize b" in str(failure.value.__notes__)
    assert env.live == set()


async def test_a_cancelled_block_abandons() -> None:
    log: list[str] = []
    env = FakeEnvironment()
    with anyio.CancelScope() as scope:
        async with TaskRun(env, PLAN, bindings=[Recording("a", log)]):
            scope.cancel()
            await anyio.sleep(1)
    assert log == ["bind a public", "abandon a"]
    assert env.live == set()


async def test_a_failed_bind_releases_the_others_and_closes_the_sandbox() -> None:
    log: list[str] = []
    env = FakeEnvironment()
    bindings = [Recording("a", log), Recording("b", log, fail="bind")]
    with pytest.raises(RuntimeError, match="bind b"):
        async with TaskRun(env, PLAN, bindings=bindings):
            pytest.fail("the block must not run")
    assert log == ["bind a public", "bind b public", "abandon a"]
    assert env.live == set()


async def test_a_sync_binding_through_a_task_run(tmp_path: Path) -> None:
    source = write_tree(tmp_path / "src", {"task.txt": "solve me\n"})
    env = ENVIRONMENTS.create("local")
    binding = SyncBinding(source=source, path=str(tmp_path / "sandbox-ws"))
    async with TaskRun(env, ExecutionPlan(), bindings=[binding]) as run:
        (bound,) = run.workspaces
        async with run.running() as sandbox:
            await sh(sandbox, f"cd {sandbox.resolve_path(bound.path)} && echo solved > task.txt")
    (snapshot,) = run.snapshots
    assert snapshot.sync.written == ("task.txt",)
    assert tree(source) == {"task.txt": "solved\n"}
