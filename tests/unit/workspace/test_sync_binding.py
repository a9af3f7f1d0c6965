"""SyncBinding on the `local` provider (sandbox paths are host paths here): copy in, the
agent's edits back, each conflict policy, limits, and two live bindings refused."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from corral.errors import (
    ConfigError,
    SyncBindingSourceConflictError,
    TransferLimitExceeded,
    UnsafeArchiveMember,
    WorkspaceBusy,
)
from corral.providers.local.session import LocalSession
from corral.workspace import SyncBinding, SyncOptions
from tests.workspaces import leftovers, sh, tree, write_tree

pytestmark = pytest.mark.anyio

FILES = {"shared.txt": "base\n", "host_only.txt": "base\n", "gone.txt": "x\n", "d/deep.py": "1\n"}


@pytest.fixture
def source(tmp_path: Path) -> Path:
    return write_tree(tmp_path / "project" / "src", FILES)


async def test_copy_in_edit_and_sync_back(local: LocalSession, ws: str, source: Path) -> None:
    (source / "run.sh").write_text("#!/bin/sh\n")
    (source / "run.sh").chmod(0o755)
    binding = SyncBinding(source=source, path=ws)
    bound = await binding.bind(local)
    assert tree(Path(ws)) == tree(source)
    assert bound.files == 6 and bound.source == str(source)
    await sh(
        local, f"cd {ws} && echo agent > shared.txt && rm gone.txt && mkdir -p n && echo n > n/new"
    )
    await sh(local, f"cd {ws} && chmod -x run.sh")

    snapshot = await binding.finalize(bound, outcome="completed")

    assert snapshot.sync is not None and snapshot.sync.synced_back
    assert snapshot.sync.written == ("n", "n/new", "run.sh", "shared.txt")
    assert snapshot.sync.deleted == ("gone.txt",)
    assert tree(source) == {**tree(Path(ws))}
    assert not (source / "run.sh").stat().st_mode & 0o111
    assert leftovers(source) == []
    assert binding.abandon(bound) is False  # finalize released it


@pytest.mark.parametrize("policy", ["overwrite", "fail", "keep_source"])
async def test_source_conflict_policies(
    local: LocalSession, ws: str, source: Path, policy: str
) -> None:
    binding = SyncBinding(source=source, path=ws, source_conflict_policy=policy)
    bound = await binding.bind(local)
    await sh(local, f"cd {ws} && echo agent > shared.txt && echo agent > agent.txt")
    # The host changes the source while the agent runs.
    write_tree(source, {"shared.txt": "host\n", "host_only.txt": "host\n"})
    host_now = tree(source)

    if policy == "fail":
        with pytest.raises(SyncBindingSourceConflictError, match="changed since it was bound"):
            await binding.finalize(bound)
        assert tree(source) == host_now
        assert leftovers(source) == []
        with pytest.raises(WorkspaceBusy):  # still held: finalize may be retried
            await SyncBinding(source=source, path=ws + "2").bind(local)
        assert binding.abandon(bound) is True
        return

    snapshot = await binding.finalize(bound)
    assert snapshot.sync is not None and snapshot.sync.source_changed
    after = tree(source)
    assert after["host_only.txt"] == "host\n"  # the agent did not touch it
    assert after["agent.txt"] == "agent\n"
    if policy == "overwrite":
        assert after["shared.txt"] == "agent\n"
        assert snapshot.sync.kept_source == ()
    else:
        assert after["shared.txt"] == "host\n"
        assert snapshot.sync.kept_source == ("shared.txt",)


async def test_pattern_delete_missing_and_sync_back_policies(
    local: LocalSession, ws: str, source: Path
) -> None:
    binding = SyncBinding(source=source, path=ws, pattern="**/*.txt", delete_missing=False)
    bound = await binding.bind(local)
    assert sorted(tree(Path(ws))) == ["gone.txt", "host_only.txt", "shared.txt"]
    await sh(local, f"cd {ws} && rm gone.txt && echo e > extra.py && echo a > a.txt")
    snapshot = await binding.finalize(bound)
    assert snapshot.sync is not None and snapshot.sync.written == ("a.txt",)
    assert (source / "gone.txt").exists() and not (source / "extra.py").exists()

    for sync_back, outcome in (("on_success", "failed"), ("never", "completed")):
        binding = SyncBinding(source=source, path=ws, sync_back=sync_back)
        bound = await binding.bind(local)
        await sh(local, f"echo lost > {ws}/shared.txt")
        snapshot = await binding.finalize(bound, outcome=outcome)
        assert snapshot.sync is not None and not snapshot.sync.synced_back
        assert (source / "shared.txt").read_text() == "base\n"


async def test_clean_target_empties_the_sandbox_path_first(
    local: LocalSession, ws: str, source: Path
) -> None:
    write_tree(Path(ws), {"stale": "from the image"})
    keeping = SyncBinding(source=source, path=ws, clean_target="never")
    bound = await keeping.bind(local)
    assert (Path(ws) / "stale").exists()
    cleaning = SyncBinding(source=source, path=ws)
    assert cleaning.abandon(bound) is False  # not its bind: it releases nothing
    with pytest.raises(WorkspaceBusy):
        await cleaning.bind(local)
    assert keeping.abandon(bound) is True
    await cleaning.bind(local)
    assert not (Path(ws) / "stale").exists()


async def test_oversize_tree_is_refused_with_nothing_written(
    local: LocalSession, ws: str, source: Path
) -> None:
    binding = SyncBinding(source=source, path=ws, max_file_bytes=1 << 20, max_files=50)
    bound = await binding.bind(local)
    before = tree(source)
    await sh(local, f"cd {ws} && echo agent > shared.txt && head -c 2097152 /dev/zero > big")
    with pytest.raises(TransferLimitExceeded, match="max_file_bytes"):
        await binding.finalize(bound)
    await sh(local, f"cd {ws} && rm big && for i in $(seq 60); do echo > f$i; done")
    with pytest.raises(TransferLimitExceeded, match="max_files=50"):
        await binding.finalize(bound)
    assert tree(source) == before
    assert leftovers(source) == []
    await sh(local, f"cd {ws} && rm f*")
    snapshot = await binding.finalize(bound)  # within the limits again: it goes through
    assert snapshot.sync is not None and snapshot.sync.written == ("shared.txt",)


async def test_oversize_source_is_refused_before_anything_is_uploaded(
    local: LocalSession, ws: str, source: Path
) -> None:
    (source / "big").write_bytes(b"x" * 4096)
    with pytest.raises(TransferLimitExceeded, match="max_total_bytes=1000"):
        await SyncBinding(source=source, path=ws, max_total_bytes=1000).bind(local)
    assert not await anyio.Path(ws).exists()
    await SyncBinding(source=source, path=ws).bind(local)  # nothing stayed reserved


async def test_two_live_bindings_of_one_source_or_target_are_refused(
    local: LocalSession, ws: str, source: Path, tmp_path: Path
) -> None:
    first = SyncBinding(source=source, path=ws)
    bound = await first.bind(local)
    other = write_tree(tmp_path / "other", {"o": "o"})
    for clash in (
        SyncBinding(source=source, path=ws + "-2"),  # the same source
        SyncBinding(source=source / "d", path=ws + "-3"),  # a source inside it
        SyncBinding(source=other, path=ws + "/sub"),  # a target inside it
    ):
        with pytest.raises(WorkspaceBusy, match="held by a live binding"):
            await clash.bind(local)
    await first.finalize(bound)
    await SyncBinding(source=source, path=ws + "-2").bind(local)


async def test_observe_revision_changes_nothing(local: LocalSession, ws: str, source: Path) -> None:
    binding = SyncBinding(source=source, path=ws)
    bound = await binding.bind(local)
    quiet = await binding.observe_revision(bound)
    assert quiet.supported and quiet.changed_paths == () and quiet.revision == bound.revision
    await sh(local, f"echo agent > {ws}/shared.txt")
    moved = await binding.observe_revision(bound)
    assert moved.changed_paths == ("shared.txt",) and moved.revision != bound.revision
    assert tree(source) == FILES and leftovers(source) == []


async def test_a_link_out_of_the_workspace_is_refused(
    local: LocalSession, ws: str, source: Path, tmp_path: Path
) -> None:
    outside = write_tree(tmp_path / "outside", {"victim": "host"})
    binding = SyncBinding(source=source, path=ws)
    bound = await binding.bind(local)
    await sh(local, f"cd {ws} && rm -r d && ln -s {outside} d && ln -s ../../outside/victim v")
    with pytest.raises(UnsafeArchiveMember):
        await binding.finalize(bound)
    assert tree(source) == FILES and tree(outside) == {"victim": "host"}


async def test_sync_back_never_writes_through_a_link_the_host_has_now(
    local: LocalSession, ws: str, source: Path, tmp_path: Path
) -> None:
    outside = write_tree(tmp_path / "outside", {"victim": "host"})
    binding = SyncBinding(source=source, path=ws)
    bound = await binding.bind(local)
    await sh(local, f"echo agent > {ws}/d/new.py && echo agent > {ws}/d/deep.py")
    (source / "d" / "deep.py").unlink()
    (source / "d").rmdir()
    (source / "d").symlink_to(outside)  # a path on the way to what the agent wrote
    with pytest.raises(SyncBindingSourceConflictError, match="no longer a directory"):
        await binding.finalize(bound)
    assert tree(outside) == {"victim": "host"}


async def test_bad_options_name_the_value(local: LocalSession, source: Path) -> None:
    with pytest.raises(ConfigError, match="'relative' must be absolute"):
        await SyncBinding(source=source, path="relative").bind(local)
    with pytest.raises(ConfigError, match="needs a sandbox path"):
        await SyncBinding(source=source).bind(local)
    with pytest.raises(ValueError, match="pattern"):
        SyncBinding(source=source, pattern="../x")
    with pytest.raises(ValueError, match="source_conflict_policy"):
        SyncBinding(source=source, source_conflict_policy="merge")
    with pytest.raises(ConfigError, match="options or fields"):
        SyncBinding(SyncOptions(source=source), path="/x")
    with pytest.raises(FileNotFoundError):
        await SyncBinding(source=source / "missing", path="/x/y").bind(local)


def test_a_positional_source_is_refused_naming_the_fields() -> None:
    with pytest.raises(ConfigError, match=r"SyncBinding\('/path'\): give the fields by name"):
        SyncBinding("/path")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
