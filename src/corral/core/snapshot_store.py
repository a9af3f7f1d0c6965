"""Snapshots kept as directory trees on the harness's host (`local`, and providers with no
image store of their own): `<root>/<id>/meta.json` beside `<root>/<id>/tree/`.

`meta.json` is written before the tree (so `gc` can remove a snapshot whose writer died)
and again, marked complete, after it; only complete, unexpired snapshots of the same
provider and owner are ever read. It holds no plan, env or policy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio

from corral.core.labels import new_session_id
from corral.core.snapshot import SnapshotRef
from corral.errors import ConfigError

_ID = re.compile(r"^snap-[a-z0-9]{12}$")
_META = "meta.json"


def default_snapshot_root(provider: str) -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "corral" / "snapshots" / provider


@dataclass(frozen=True)
class SnapshotShelf:
    """Where one provider and owner keep their snapshots, and for how long."""

    root: Path
    provider: str
    owner: str
    lifetime_s: float

    async def write(
        self, source_session: str, fill: Callable[[Path], Awaitable[None]]
    ) -> SnapshotRef:
        """A new snapshot whose tree `fill(tree_dir)` writes; removed again if `fill` fails."""
        now = datetime.now(UTC)
        ref = SnapshotRef(
            provider=self.provider,
            id=f"snap-{new_session_id()}",
            created_at=now,
            source_session=source_session,
            expires_at=now + timedelta(seconds=self.lifetime_s),
        )
        directory = self.root / ref.id
        await anyio.to_thread.run_sync(lambda: directory.mkdir(mode=0o700, parents=True))
        try:
            await anyio.to_thread.run_sync(self._write_meta, directory, ref, False)
            tree = directory / "tree"
            tree.mkdir(mode=0o700)
            await fill(tree)
            await anyio.to_thread.run_sync(self._write_meta, directory, ref, True)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(lambda: shutil.rmtree(directory, ignore_errors=True))
            raise
        return ref

    def tree(self, ref: SnapshotRef) -> Path:
        """The tree of `ref`, or a `ConfigError` saying why it cannot be used."""
        if not _ID.match(ref.id):
            raise ConfigError(f"snapshot id {ref.id!r} is not one corral makes")
        meta = _read_meta(self.root / ref.id)
        if meta is None or not meta.get("complete"):
            raise ConfigError(
                f"snapshot {ref.id!r} does not exist (or was never completed) in {self.root}"
            )
        if not self._ours(meta):
            raise ConfigError(f"snapshot {ref.id!r} belongs to another provider or owner")
        if datetime.fromisoformat(meta["expires_at"]) <= datetime.now(UTC):
            raise ConfigError(f"snapshot {ref.id!r} expired at {meta['expires_at']}")
        return self.root / ref.id / "tree"

    def remove_expired(self) -> list[str]:
        """Remove this provider's and owner's expired snapshots; returns what went."""
        removed: list[str] = []
        if not self.root.is_dir():
            return removed
        now = datetime.now(UTC)
        for directory in sorted(self.root.iterdir()):
            meta = _read_meta(directory) if _ID.match(directory.name) else None
            if meta is None or not self._ours(meta):
                continue
            if datetime.fromisoformat(meta["expires_at"]) <= now:
                shutil.rmtree(directory, ignore_errors=True)
                removed.append(f"snapshot {directory.name}")
        return removed

    def _ours(self, meta: dict[str, Any]) -> bool:
        return meta.get("provider") == self.provider and meta.get("owner") == self.owner

    def _write_meta(self, directory: Path, ref: SnapshotRef, complete: bool) -> None:
        body = {"corral": "snapshot", "owner": self.owner, "complete": complete}
        body |= ref.model_dump(mode="json")
        partial = directory / f".{_META}.partial"
        partial.write_text(json.dumps(body), encoding="utf-8")
        partial.replace(directory / _META)


def _read_meta(directory: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((directory / _META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("corral") != "snapshot":  # pyright: ignore[reportUnknownMemberType]
        return None
    return meta  # pyright: ignore[reportUnknownVariableType]
