"""The host-side snapshot shelf: a failed write leaves nothing, a half-written snapshot
is never read but is still collected once expired."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from corral import ConfigError
from corral.core.snapshot_store import SnapshotShelf

pytestmark = pytest.mark.anyio


def _entries(directory: Path) -> list[Path]:
    return list(directory.iterdir())


def _shelf(root: Path, lifetime_s: float = 60.0) -> SnapshotShelf:
    return SnapshotShelf(root=root, provider="local", owner="me", lifetime_s=lifetime_s)


async def test_a_failed_write_leaves_nothing(tmp_path: Path) -> None:
    async def fill(tree: Path) -> None:
        (tree / "half").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        await _shelf(tmp_path).write("parent", fill)
    assert _entries(tmp_path) == []


async def test_a_snapshot_whose_writer_died_is_never_read_but_expires(tmp_path: Path) -> None:
    async def fill(tree: Path) -> None:
        (tree / "f").write_text("x")

    shelf = _shelf(tmp_path, lifetime_s=0.2)
    ref = await shelf.write("parent", fill)
    meta = tmp_path / ref.id / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "complete": False}))
    with pytest.raises(ConfigError, match="never completed"):
        shelf.tree(ref)
    assert shelf.remove_expired() == []
    await anyio.sleep(0.3)
    assert shelf.remove_expired() == [f"snapshot {ref.id}"]
    assert _entries(tmp_path) == []
