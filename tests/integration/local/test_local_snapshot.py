"""save → fork on the local provider: the fork has the parent's workspace files, its own
id, cgroup and baseline policy, and none of the parent's processes."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest

from corral import ConfigError, ExecutionPlan, NetworkSchedule, SnapshotRef
from corral.providers.local import LocalEnvironment
from corral.providers.local.cgroup import SessionCgroup
from corral.providers.local.session import LocalSession
from tests.integration.conftest import unavailable

pytestmark = pytest.mark.anyio


def procs(session: LocalSession) -> list[str]:
    assert isinstance(session.tree, SessionCgroup), session.tree
    return (session.tree.path / "cgroup.procs").read_text().split()


async def test_a_fork_has_the_files_and_none_of_the_processes(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        unavailable("a session cgroup (to show whose processes are whose) needs root")
    env = LocalEnvironment(snapshot_dir=tmp_path / "snapshots", owner="corral-test-local")
    async with env.session(ExecutionPlan()) as parent:
        assert isinstance(parent, LocalSession)
        await parent.write_text("notes/progress.txt", "step 3 of 5")
        # Returns once the sleeper leads its own session, out of the exec's process group.
        sleeper = await parent.exec(
            "setsid nohup sleep 1000 >/dev/null 2>&1 & p=$!; "
            "until [ \"$(cut -d' ' -f6 /proc/$p/stat)\" = $p ]; do sleep 0.01; done; echo $p"
        )
        ref = await parent.save()
        assert ref.provider == "local" and ref.source_session == parent.id
        plan = ExecutionPlan(network=NetworkSchedule.model_validate("no-network"))
        fork = await env.fork(ref, plan)
        try:
            assert isinstance(fork, LocalSession)
            assert fork.id != parent.id and fork.workspace != parent.workspace
            assert await fork.read_text("notes/progress.txt") == "step 3 of 5"
            assert fork.policy.network_mode.value == "no-network"
            assert procs(fork) == []
            assert sleeper.stdout.strip() in procs(parent)
            # A later write in the parent does not reach the saved copy.
            await parent.write_text("notes/progress.txt", "step 4 of 5")
            assert await fork.read_text("notes/progress.txt") == "step 3 of 5"
        finally:
            await env.close(fork)


async def test_snapshots_expire_and_refuse_what_is_not_theirs(tmp_path: Path) -> None:
    shelf = tmp_path / "snapshots"
    env = LocalEnvironment(snapshot_dir=shelf, owner="corral-test-a", snapshot_lifetime_s=0.5)
    async with env.session(ExecutionPlan()) as parent:
        await parent.write_text("a.txt", "a")
        ref = await parent.save()
    stranger = LocalEnvironment(snapshot_dir=shelf, owner="corral-test-b")
    with pytest.raises(ConfigError, match="owner 'corral-test-b'"):
        await stranger.fork(ref, ExecutionPlan())
    forged = ref.model_copy(update={"id": "../../etc"})
    with pytest.raises(ConfigError, match=r"'\.\./\.\./etc'"):
        await env.fork(forged, ExecutionPlan())
    assert await stranger.gc() == []
    await anyio.sleep((ref.expires_at - datetime.now(UTC)).total_seconds() + 0.05)
    with pytest.raises(ConfigError, match="expired"):
        await env.fork(ref, ExecutionPlan())
    assert await env.gc() == [f"snapshot {ref.id}"]
    assert list(shelf.iterdir()) == []


async def test_a_missing_snapshot_is_named(tmp_path: Path) -> None:
    env = LocalEnvironment(snapshot_dir=tmp_path)
    now = datetime.now(UTC)
    ref = SnapshotRef(
        provider="local",
        id="snap-0000000000000000",
        created_at=now,
        source_session="x",
        expires_at=now,
    )
    with pytest.raises(ConfigError, match="'snap-0000000000000000'.* is not kept"):
        await env.fork(ref, ExecutionPlan())


async def test_a_discarded_snapshot_is_gone_and_anothers_is_left_alone(tmp_path: Path) -> None:
    shelf = tmp_path / "snapshots"
    env = LocalEnvironment(snapshot_dir=shelf, owner="corral-test-a")
    async with env.session(ExecutionPlan()) as parent:
        await parent.write_text("a.txt", "a")
        ref = await parent.save()
    fork = await env.fork(ref, ExecutionPlan())
    stranger = LocalEnvironment(snapshot_dir=shelf, owner="corral-test-b")
    with pytest.raises(ConfigError, match=f"{ref.id}.*left alone"):
        await stranger.discard_snapshot(ref)
    assert (shelf / ref.id).is_dir()
    with pytest.raises(ConfigError, match=r"'\.\./x'"):
        await env.discard_snapshot(ref.model_copy(update={"id": "../x"}))
    with pytest.raises(ConfigError, match="provider 'docker'"):
        await env.discard_snapshot(ref.model_copy(update={"provider": "docker"}))
    try:
        await env.discard_snapshot(ref)
        assert list(shelf.iterdir()) == []
        assert await fork.read_text("a.txt") == "a", "a fork keeps its files"
    finally:
        await env.close(fork)
    await env.discard_snapshot(ref)  # gone is no error
    with pytest.raises(ConfigError, match="is not kept"):
        await env.fork(ref, ExecutionPlan())
