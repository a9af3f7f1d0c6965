"""Hostile tar archives, and snapshots that show whether extracting one touched the host."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from pathlib import Path

FILE = tarfile.REGTYPE
DIR = tarfile.DIRTYPE
SYMLINK = tarfile.SYMTYPE
HARDLINK = tarfile.LNKTYPE

#: (name, type, link target, content) of one member.
Member = tuple[str, bytes, str, bytes]

# `s -> .` makes `s/s/x` the root's `x`, which is then pointed two levels up; `x/FILE`
# writes there. A lexical check of each name and target passes all three.
CHAIN: list[Member] = [
    ("s", SYMLINK, ".", b""),
    ("s/s/x", SYMLINK, "../..", b""),
    ("x/FILE", FILE, "", b"written through a chain of links"),
]


def hardlink_chain(victim: str) -> list[Member]:
    """The chain, then a hard link to `victim` (a path under the chain's end) rewritten."""
    return [*CHAIN[:2], ("h", HARDLINK, f"x/{victim}", b""), ("h", FILE, "", b"overwritten")]


def crafted_tar(members: list[Member]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name, kind, link, data in members:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.size = kind, link, len(data)
            info.mode = 0o755 if kind == DIR else 0o644
            archive.addfile(info, io.BytesIO(data) if kind == FILE else None)
    return buffer.getvalue()


def snapshot(root: Path, *, skip: Path) -> dict[str, tuple[object, ...]]:
    """Every entry under `root` except the subtree `skip`: type, mode, mtime, links, content.

    `skip`'s parent is listed with its type and mode only: creating `skip` in it (and the
    extraction's staging directory beside it) changes its mtime and link count.
    """
    entries: dict[str, tuple[object, ...]] = {}
    for here, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(here) / name
            if path == skip:
                continue
            st = path.lstat()
            if path == skip.parent:
                entries[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), st.st_mode)
                continue
            if stat.S_ISLNK(st.st_mode):
                content: object = str(path.readlink())
            elif stat.S_ISREG(st.st_mode):
                content = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                content = None
            entries[str(path.relative_to(root))] = (
                stat.S_IFMT(st.st_mode),
                st.st_mode,
                st.st_mtime_ns,
                st.st_nlink,
                content,
            )
        dirnames[:] = [d for d in dirnames if Path(here) / d != skip]
    return entries


def escaping_links(dest: Path) -> list[str]:
    """Entries under `dest` that resolve (following every link) to a place outside it."""
    root = Path(os.path.realpath(dest))
    found: list[str] = []
    for here, dirnames, filenames in os.walk(dest):
        for name in [*dirnames, *filenames]:
            path = Path(here) / name
            if not Path(os.path.realpath(path)).is_relative_to(root):
                found.append(str(path.relative_to(dest)))
    return found
