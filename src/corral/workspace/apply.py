"""Sync-back: the sandbox's changes, decided path by path, applied to the host source.

Only what the agent changed is applied (a path whose entry differs between what was bound
and what came back); what the host changed meanwhile is the conflict the policy decides.
Applying goes through directory descriptors opened without following links, and each
file or link is created under a fresh name and renamed into place, so nothing the
sandbox sent, and no link on the host, redirects a write outside the source.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from corral.core.tarsafe import CHUNK
from corral.errors import SyncBindingSourceConflictError
from corral.workspace.manifest import Manifest

ConflictPolicy = Literal["overwrite", "fail", "keep_source"]

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Changes:
    writes: tuple[str, ...]
    deletes: tuple[str, ...]
    kept: tuple[str, ...]
    source_changed: bool


def decide(
    bound: Manifest,
    returned: Manifest,
    source_now: Manifest,
    *,
    source: Path,
    policy: ConflictPolicy,
    delete_missing: bool,
) -> Changes:
    """What to apply, given the tree bound, the tree that came back and the source now."""
    source_changed = source_now.digest() != bound.digest()
    if source_changed and policy == "fail":
        moved = bound.differing(source_now)
        raise SyncBindingSourceConflictError(
            str(source), detail=f" ({len(moved)} path(s), first {moved[0]!r})"
        )
    changed = bound.differing(returned)
    now = source_now.entries
    conflicts = {
        p for p in changed if now.get(p) not in (bound.entries.get(p), returned.entries.get(p))
    }
    kept: set[str] = set()
    if policy == "keep_source":
        kept = {p for p in changed if p in conflicts or _under(p, conflicts)}
    wanted = [p for p in changed if p not in kept]
    writes = tuple(p for p in wanted if p in returned.entries and now.get(p) != returned.entries[p])
    deletes = tuple(
        sorted(
            (p for p in wanted if p not in returned.entries and p in now and delete_missing),
            reverse=True,
        )
    )
    return Changes(writes, deletes, tuple(sorted(kept)), source_changed)


def _under(path: str, ancestors: set[str]) -> bool:
    return any(parent.as_posix() in ancestors for parent in PurePosixPath(path).parents)


def apply(
    source: Path, staged: Path, returned: Manifest, changes: Changes
) -> tuple[list[str], list[str]]:
    """Apply `changes` from the staged tree to `source`; returns (written, deleted)."""
    written: list[str] = []
    deleted: list[str] = []
    try:
        with _opened(os.open(source, _DIRECTORY)) as root:
            for path in changes.deletes:
                with _parent(root, path) as (parent, leaf):
                    if _remove(parent, leaf, allow_non_empty=True):
                        deleted.append(path)
            for path in changes.writes:
                with _parent(root, path) as (parent, leaf):
                    _write(parent, leaf, staged / path, returned.entries[path].kind)
                written.append(path)
    except _Unreachable as exc:
        raise SyncBindingSourceConflictError(
            str(source), applied_paths=(*deleted, *written), detail=f": {exc}"
        ) from None
    except OSError as exc:
        exc.add_note(
            f"corral: {len(deleted) + len(written)} path(s) of {str(source)!r} were applied first"
        )
        raise
    return written, deleted


class _Unreachable(Exception):
    pass


@contextmanager
def _opened(fd: int) -> Generator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


@contextmanager
def _parent(root: int, path: str) -> Generator[tuple[int, str]]:
    *parents, leaf = PurePosixPath(path).parts
    fd = os.dup(root)
    try:
        for depth, part in enumerate(parents, 1):
            try:
                child = os.open(part, _DIRECTORY, dir_fd=fd)
            except OSError:
                where = "/".join(parents[:depth])
                raise _Unreachable(f"{where!r} is no longer a directory on the host") from None
            os.close(fd)
            fd = child
        yield fd, leaf
    finally:
        os.close(fd)


def _lstat(leaf: str, parent: int) -> os.stat_result | None:
    try:
        return os.stat(leaf, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _remove(parent: int, leaf: str, *, allow_non_empty: bool) -> bool:
    """Remove what is at `leaf`; a directory the host still keeps files in stays, or fails."""
    existing = _lstat(leaf, parent)
    if existing is None:
        return False
    if not stat.S_ISDIR(existing.st_mode):
        os.unlink(leaf, dir_fd=parent)
        return True
    try:
        os.rmdir(leaf, dir_fd=parent)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        if allow_non_empty:
            return False
        raise _Unreachable(
            f"{leaf!r} is a directory holding files the sandbox did not delete"
        ) from None
    return True


def _write(parent: int, leaf: str, staged: Path, kind: str) -> None:
    existing = _lstat(leaf, parent)
    if kind == "d":
        if existing is not None and stat.S_ISDIR(existing.st_mode):
            return
        if existing is not None:
            os.unlink(leaf, dir_fd=parent)
        os.mkdir(leaf, 0o755, dir_fd=parent)
        return
    fresh = f".{leaf[:64]}.{secrets.token_hex(4)}.corral-sync"
    try:
        if kind == "l":
            os.symlink(staged.readlink(), fresh, dir_fd=parent)
        else:
            _copy(staged, parent, fresh)
        if existing is not None and stat.S_ISDIR(existing.st_mode):
            _remove(parent, leaf, allow_non_empty=False)
        os.rename(fresh, leaf, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        if _lstat(fresh, parent) is not None:
            os.unlink(fresh, dir_fd=parent)
        raise


def _copy(staged: Path, parent: int, fresh: str) -> None:
    info = staged.lstat()
    mode = 0o755 if info.st_mode & stat.S_IXUSR else 0o644
    with (
        os.fdopen(os.open(staged, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as src,
        os.fdopen(os.open(fresh, _NEW_FILE, mode, dir_fd=parent), "wb") as out,
    ):
        while chunk := src.read(CHUNK):
            out.write(chunk)
        os.fchmod(out.fileno(), mode)
