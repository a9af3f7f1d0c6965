"""Saved `k8s` sandboxes, kept by corral on this host (no registry, no image commit).

`session.save()` packs the declared directories in the Pod and extracts each one through
the same hardened path as `download_dir`: the archive is whatever the Pod's `tar` prints,
so nothing in it lands outside its tree, and `snapshot_limits` bound what it may hold. A
snapshot is one directory of its own here:

    <snapshot_dir>/<id>/corral-snapshot.json   what corral knows of it (never env, plan,
                                               policy or anything secret)
    <snapshot_dir>/<id>/trees/<n>/             the n-th saved directory

The metadata is written before any tree, so a save that dies half-way leaves a directory
gc still recognises (its ref was never handed out). gc removes only directories whose
metadata parses, names this owner, and has expired.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from corral.core.snapshot import SnapshotRef
from corral.core.treelimits import TreeLimits
from corral.errors import ConfigError

METADATA = "corral-snapshot.json"
_ID = re.compile(r"^snap-[0-9a-f]{16}$")


class SnapshotRecord(BaseModel):
    """The metadata of one saved snapshot, as written next to its trees."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    provider: Literal["k8s"] = "k8s"
    owner: str
    id: str
    source_session: str
    created_at: datetime
    expires_at: datetime
    #: the sandbox directories saved, in the order of `trees/<n>`
    paths: tuple[str, ...]

    def ref(self) -> SnapshotRef:
        return SnapshotRef(
            provider=self.provider,
            id=self.id,
            created_at=self.created_at,
            source_session=self.source_session,
            expires_at=self.expires_at,
        )


def default_root() -> Path:
    """$XDG_CACHE_HOME/corral/k8s-snapshots, else ~/.cache/corral/k8s-snapshots."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "corral" / "k8s-snapshots"


class SnapshotStore:
    """One owner's snapshots under `root`, and what a save takes from a sandbox."""

    def __init__(
        self,
        root: Path,
        *,
        owner: str,
        lifetime_s: float,
        limits: TreeLimits,
        paths: tuple[str, ...] | None,
    ) -> None:
        self.root = root
        self.owner = owner
        self.lifetime_s = lifetime_s
        self.limits = limits
        self.paths = paths

    def paths_for(self, workdir: str) -> tuple[str, ...]:
        """The configured paths, else the session's working directory."""
        if self.paths is not None:
            return self.paths
        if workdir == "/":
            raise ConfigError(
                "the sandbox's working directory is '/', which a snapshot cannot hold; "
                "set snapshot_paths in the k8s config (or plan.workdir)"
            )
        return (workdir,)

    def begin(self, source_session: str, paths: tuple[str, ...]) -> SnapshotRecord:
        """A new snapshot directory holding only its metadata."""
        now = datetime.now(UTC)
        record = SnapshotRecord(
            owner=self.owner,
            id=f"snap-{secrets.token_hex(8)}",
            source_session=source_session,
            created_at=now,
            expires_at=now + timedelta(seconds=self.lifetime_s),
            paths=paths,
        )
        # Saved trees are the sandbox's files, maybe secrets it wrote: this user's only.
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory = self.root / record.id
        directory.mkdir(mode=0o700)
        (directory / METADATA).write_text(record.model_dump_json(), encoding="utf-8")
        return record

    def tree(self, snapshot_id: str, index: int) -> Path:
        return self.root / snapshot_id / "trees" / str(index)

    def discard(self, snapshot_id: str) -> None:
        directory = self.root / snapshot_id
        if directory.is_dir() and not directory.is_symlink():
            _remove(directory)

    def load(self, ref: SnapshotRef) -> SnapshotRecord:
        """The record of `ref`, if it is this owner's, complete and not expired."""
        where = f"snapshot {ref.id!r} (from session {ref.source_session!r})"
        if not _ID.match(ref.id):
            raise ConfigError(f"{where} is not an id the k8s provider makes")
        record = self._read(self.root / ref.id)
        if record is None or record.owner != self.owner:
            raise ConfigError(
                f"{where} is not kept in {str(self.root)!r} for owner {self.owner!r}; it was "
                "saved elsewhere, or removed"
            )
        if record.expires_at <= datetime.now(UTC):
            raise ConfigError(f"{where} expired at {record.expires_at.isoformat()}")
        for index in range(len(record.paths)):
            tree = self.tree(record.id, index)
            if tree.is_symlink() or not tree.is_dir():
                raise ConfigError(f"{where} is incomplete: {str(tree)!r} is missing")
        return record

    def collect(self, now: datetime | None = None) -> list[str]:
        """Remove this owner's expired snapshots; what went, as `snapshot <id>`."""
        moment = now or datetime.now(UTC)
        removed: list[str] = []
        if not self.root.is_dir():
            return removed
        for entry in sorted(self.root.iterdir()):
            if not _ID.match(entry.name) or entry.is_symlink() or not entry.is_dir():
                continue
            record = self._read(entry)
            if record is None or record.owner != self.owner or record.id != entry.name:
                continue
            if record.expires_at <= moment:
                _remove(entry)
                removed.append(f"snapshot {record.id}")
        return removed

    def _read(self, directory: Path) -> SnapshotRecord | None:
        try:
            return SnapshotRecord.model_validate_json((directory / METADATA).read_bytes())
        except (OSError, ValidationError):
            return None


def _remove(path: Path) -> None:
    """Remove a snapshot directory; a saved tree keeps the Pod's modes, read-only
    directories included, so every directory is made writable first (links not followed)."""
    path.chmod(0o700)
    for directory, names, _ in os.walk(path):
        for name in names:
            child = Path(directory, name)
            if not child.is_symlink():
                child.chmod(0o700)
    shutil.rmtree(path)
