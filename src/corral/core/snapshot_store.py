"""Snapshots kept by corral on the harness's host (`local`, and `k8s`, which has no image
store it may write to). One directory per snapshot:

    <root>/<id>/corral-snapshot.json   what corral knows of it (never env, plan, policy or
                                       anything secret)
    <root>/<id>/trees/<n>/             the n-th saved directory

The metadata is written before any tree, so a save that dies half-way leaves a directory
gc still recognises, and again, marked complete, once every tree is in; only complete,
unexpired snapshots of the same provider and owner are ever read. gc removes only
directories whose metadata parses, names this provider and owner, and has expired.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
from pydantic import BaseModel, ConfigDict, ValidationError

from corral.core.snapshot import SnapshotRef
from corral.errors import ConfigError

METADATA = "corral-snapshot.json"
_ID = re.compile(r"^snap-[0-9a-f]{16}$")


class SnapshotRecord(BaseModel):
    """The metadata of one saved snapshot, as written next to its trees."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    provider: str
    owner: str
    id: str
    source_session: str
    created_at: datetime
    expires_at: datetime
    #: the sandbox directories saved, in the order of `trees/<n>`
    paths: tuple[str, ...]
    complete: bool = False

    def ref(self) -> SnapshotRef:
        return SnapshotRef(
            provider=self.provider,
            id=self.id,
            created_at=self.created_at,
            source_session=self.source_session,
            expires_at=self.expires_at,
        )


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/corral, else ~/.cache/corral."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "corral"


def default_root(provider: str) -> Path:
    """`cache_dir()`/snapshots/<provider>."""
    return cache_dir() / "snapshots" / provider


class SnapshotShelf:
    """One provider's and owner's snapshots under `root`."""

    def __init__(self, root: Path, *, provider: str, owner: str, lifetime_s: float) -> None:
        self.root = root
        self.provider = provider
        self.owner = owner
        self.lifetime_s = lifetime_s

    async def write(
        self,
        source_session: str,
        paths: tuple[str, ...],
        fill: Callable[[SnapshotRecord], Awaitable[None]],
    ) -> SnapshotRef:
        """A new snapshot of `paths`, whose trees `fill` writes (at `tree(id, n)`); removed
        again if `fill` fails or is cancelled."""
        record = await anyio.to_thread.run_sync(self._begin, source_session, paths)
        try:
            await fill(record)
            done = record.model_copy(update={"complete": True})
            await anyio.to_thread.run_sync(self._write_record, done)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self.discard, record.id)
            raise
        return done.ref()

    def tree(self, snapshot_id: str, index: int) -> Path:
        return self.root / snapshot_id / "trees" / str(index)

    def discard(self, snapshot_id: str) -> None:
        directory = self.root / snapshot_id
        if _ID.match(snapshot_id) and directory.is_dir() and not directory.is_symlink():
            _remove(directory)

    def load(self, ref: SnapshotRef) -> SnapshotRecord:
        """The record of `ref`, if it is this provider's and owner's, complete and not
        expired; else a `ConfigError` saying why not."""
        where = f"snapshot {ref.id!r} (from session {ref.source_session!r})"
        if not _ID.match(ref.id):
            raise ConfigError(f"{where} is not an id corral makes")
        record = self._read(self.root / ref.id)
        if record is None or (record.provider, record.owner) != (self.provider, self.owner):
            raise ConfigError(
                f"{where} is not kept in {str(self.root)!r} for provider {self.provider!r} "
                f"and owner {self.owner!r}; it was saved elsewhere, or removed"
            )
        if not record.complete:
            raise ConfigError(f"{where} is incomplete: its save never finished")
        if record.expires_at <= datetime.now(UTC):
            raise ConfigError(f"{where} expired at {record.expires_at.isoformat()}")
        for index in range(len(record.paths)):
            tree = self.tree(record.id, index)
            if tree.is_symlink() or not tree.is_dir():
                raise ConfigError(f"{where} is incomplete: {str(tree)!r} is missing")
        return record

    def remove(self, ref: SnapshotRef) -> None:
        """Remove snapshot `ref` if it is this provider's and owner's; gone is no error,
        another's is a `ConfigError` (that directory is left alone)."""
        if not _ID.match(ref.id):
            raise ConfigError(f"snapshot {ref.id!r} is not an id corral makes")
        entry = self.root / ref.id
        if entry.is_symlink() or not entry.is_dir():
            return
        record = self._read(entry)
        if record is None or (record.provider, record.owner, record.id) != (
            self.provider,
            self.owner,
            ref.id,
        ):
            raise ConfigError(
                f"snapshot {ref.id!r} in {str(self.root)!r} is not provider {self.provider!r}'s "
                f"and owner {self.owner!r}'s; left alone"
            )
        _remove(entry)

    def collect(self, now: datetime | None = None) -> list[str]:
        """Remove this provider's and owner's expired snapshots; what went, as
        `snapshot <id>`."""
        moment = now or datetime.now(UTC)
        removed: list[str] = []
        if not self.root.is_dir():
            return removed
        for entry in sorted(self.root.iterdir()):
            if not _ID.match(entry.name) or entry.is_symlink() or not entry.is_dir():
                continue
            record = self._read(entry)
            if record is None or record.id != entry.name:
                continue
            if (record.provider, record.owner) != (self.provider, self.owner):
                continue
            if record.expires_at <= moment:
                _remove(entry)
                removed.append(f"snapshot {record.id}")
        return removed

    def _begin(self, source_session: str, paths: tuple[str, ...]) -> SnapshotRecord:
        now = datetime.now(UTC)
        record = SnapshotRecord(
            provider=self.provider,
            owner=self.owner,
            id=f"snap-{secrets.token_hex(8)}",
            source_session=source_session,
            created_at=now,
            expires_at=now + timedelta(seconds=self.lifetime_s),
            paths=paths,
        )
        # Saved trees are the sandbox's files, maybe secrets it wrote: this user's only.
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.root / record.id).mkdir(mode=0o700)
        self._write_record(record)
        return record

    def _write_record(self, record: SnapshotRecord) -> None:
        partial = self.root / record.id / f".{METADATA}.partial"
        partial.write_text(record.model_dump_json(), encoding="utf-8")
        partial.replace(self.root / record.id / METADATA)

    def _read(self, directory: Path) -> SnapshotRecord | None:
        try:
            return SnapshotRecord.model_validate_json((directory / METADATA).read_bytes())
        except (OSError, ValidationError):
            return None


def _remove(path: Path) -> None:
    """Remove a snapshot directory; a saved tree keeps the sandbox's modes, read-only
    directories included, so every directory is made writable first (links not followed)."""
    path.chmod(0o700)
    for directory, names, _ in os.walk(path):
        for name in names:
            child = Path(directory, name)
            if not child.is_symlink():
                child.chmod(0o700)
    shutil.rmtree(path)
