"""A sandbox directory brought to the host, held to limits while it streams."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio

from corral.core.session import EnvironmentSession
from corral.core.treelimits import TreeLimits, bounded


@asynccontextmanager
async def retrieved(
    session: EnvironmentSession, remote: str, limits: TreeLimits, *, beside: Path | None = None
) -> AsyncGenerator[Path]:
    """The tree at `remote`, extracted into a fresh directory (beside `beside`, so that what
    is applied from it is renamed, not copied across filesystems) and removed afterwards.

    The provider's extractor refuses links and paths that leave the directory; `limits`
    stop the stream at the first entry or byte over them, before the block runs.
    """
    where = None if beside is None else beside.parent
    holder = Path(
        await anyio.to_thread.run_sync(lambda: tempfile.mkdtemp(prefix=".corral-ws-", dir=where))
    )
    try:
        tree = holder / "tree"
        with bounded(limits):
            await session.download_dir(remote, tree)
        await anyio.to_thread.run_sync(_make_readable, tree)
        yield tree
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(remove_tree, holder)


def _make_readable(root: Path) -> None:
    """The archive chose the modes; the harness must be able to read and remove it all.

    A directory left unreadable would look empty, which sync-back would take for files the
    agent deleted: walking errors are raised, never skipped.
    """
    root.chmod(0o700)
    for directory, dirnames, filenames in os.walk(root, onerror=_raise):
        for name in dirnames:
            path = Path(directory, name)
            if not path.is_symlink():
                path.chmod(0o700)
        for name in filenames:
            path = Path(directory, name)
            info = path.lstat()
            if stat.S_ISREG(info.st_mode):
                path.chmod((info.st_mode & 0o777) | 0o600)


def _raise(error: OSError) -> None:
    raise error


def remove_tree(path: Path) -> None:
    if not path.exists():
        return
    _make_readable(path)
    shutil.rmtree(path)
