"""The host-side snapshot shelf (`local` and `k8s`): records, expiry, refusals, and a save
that fails or dies half-way."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest

from corral import ConfigError
from corral.core.snapshot_store import METADATA, SnapshotRecord, SnapshotShelf

pytestmark = pytest.mark.anyio


def _entries(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _shelf(root: Path, owner: str = "me", lifetime_s: float = 60.0) -> SnapshotShelf:
    return SnapshotShelf(root, provider="k8s", owner=owner, lifetime_s=lifetime_s)


async def _save(shelf: SnapshotShelf, paths: tuple[str, ...] = ("/work",)) -> SnapshotRecord:
    async def fill(record: SnapshotRecord) -> None:
        for index in range(len(record.paths)):
            shelf.tree(record.id, index).mkdir(parents=True)

    ref = await shelf.write("sess", paths, fill)
    return shelf.load(ref)


async def test_a_snapshot_loads_until_it_expires_then_gc_takes_only_it(tmp_path: Path) -> None:
    shelf = _shelf(tmp_path)
    record = await _save(shelf)
    assert record.complete and record.paths == ("/work",)
    assert (tmp_path / record.id).stat().st_mode & 0o077 == 0
    metadata = json.loads((tmp_path / record.id / METADATA).read_text())
    assert set(metadata) == {
        "provider", "owner", "id", "source_session", "created_at", "expires_at", "paths",
        "complete",
    }  # fmt: skip
    theirs = await _save(_shelf(tmp_path, owner="them"))
    local = await _save(SnapshotShelf(tmp_path, provider="local", owner="me", lifetime_s=60))
    (tmp_path / "snap-ffffffffffffffff").mkdir()  # no metadata: not corral's to remove
    later = datetime.now(UTC) + timedelta(seconds=61)
    assert shelf.collect(later) == [f"snapshot {record.id}"]
    assert _entries(tmp_path) == sorted([theirs.id, local.id, "snap-ffffffffffffffff"])


async def test_expired_missing_incomplete_and_forged_refs_are_refused(tmp_path: Path) -> None:
    short = _shelf(tmp_path, lifetime_s=0.05)
    record = await _save(short)
    await anyio.sleep(0.1)
    with pytest.raises(ConfigError, match=f"{record.id}.*expired"):
        short.load(record.ref())
    shelf = _shelf(tmp_path)
    two = await _save(shelf, ("/a", "/b"))
    with pytest.raises(ConfigError, match="provider 'local'"):
        SnapshotShelf(tmp_path, provider="local", owner="me", lifetime_s=60).load(two.ref())
    with pytest.raises(ConfigError, match="owner 'them'"):
        _shelf(tmp_path, owner="them").load(two.ref())
    forged = two.ref().model_copy(update={"id": "../../etc"})
    with pytest.raises(ConfigError, match="'../../etc'"):
        shelf.load(forged)
    shelf.tree(two.id, 1).rmdir()
    with pytest.raises(ConfigError, match="incomplete"):
        shelf.load(two.ref())


async def test_a_failed_save_leaves_nothing(tmp_path: Path) -> None:
    shelf = _shelf(tmp_path)

    async def fill(record: SnapshotRecord) -> None:
        shelf.tree(record.id, 0).mkdir(parents=True)
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        await shelf.write("sess", ("/work",), fill)
    assert _entries(tmp_path) == []


async def test_a_save_that_died_half_way_is_never_read_but_expires(tmp_path: Path) -> None:
    shelf = _shelf(tmp_path, lifetime_s=0.05)
    record = await _save(shelf)
    meta = tmp_path / record.id / METADATA
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "complete": False}))
    with pytest.raises(ConfigError, match="never finished"):
        shelf.load(record.ref())
    assert shelf.collect() == []
    await anyio.sleep(0.1)
    assert shelf.collect() == [f"snapshot {record.id}"]
    assert _entries(tmp_path) == []
