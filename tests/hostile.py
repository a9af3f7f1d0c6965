"""Hostile archives and sandboxes, and snapshots that show whether a transfer touched
anything on the host outside its destination."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from corral.core.session import EnvironmentSession
from corral.errors import UnsafeArchiveMember

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


# Built in a sandbox directory: `d/..` climbs from where `d` leads (the directory itself),
# so `sub/l` is the directory's parent, though counting `..` says the directory.
DOTDOT_AFTER_A_LINK = "ln -s . d && mkdir sub && ln -s ../d/.. sub/l"


def hardlink_chain(victim: str) -> list[Member]:
    """The chain, then a hard link to `victim` (a path under the chain's end) rewritten."""
    return [*CHAIN[:2], ("h", HARDLINK, f"x/{victim}", b""), ("h", FILE, "", b"overwritten")]


def host_tree(tmp: Path) -> Path:
    """tmp/outside (a victim file, a directory), tmp/box/sentinel, a link tmp/box/lnk to
    tmp/outside; returns tmp/box/dest, the destination to extract into."""
    (tmp / "outside" / "dir").mkdir(parents=True)
    (tmp / "outside" / "victim").write_text("host file")
    (tmp / "box").mkdir()
    (tmp / "box" / "sentinel").write_text("beside the destination")
    (tmp / "box" / "lnk").symlink_to("../outside")
    return tmp / "box" / "dest"


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


async def sh(sandbox: EnvironmentSession, script: str, service: str | None = None) -> str:
    result = await sandbox.exec(script, service=service)
    assert result.returncode == 0, result
    return result.stdout


async def refused_download(
    sandbox: EnvironmentSession, remote_dir: str, host: Path, service: str | None = None
) -> None:
    """download_dir of `remote_dir` into `host_tree(host)` is refused, changing nothing."""
    dest = host_tree(host)
    before = snapshot(host, skip=dest)
    with pytest.raises(UnsafeArchiveMember, match="would land outside"):
        await sandbox.download_dir(remote_dir, dest, service=service)
    assert snapshot(host, skip=dest) == before
    assert not dest.exists()


async def a_dotdot_after_a_link_is_refused(sandbox: EnvironmentSession, host: Path) -> None:
    """A tree whose `..` follows a link the workload made is refused at download_dir."""
    await sh(sandbox, f"mkdir -p /tmp/down && cd /tmp/down && {DOTDOT_AFTER_A_LINK}")
    await refused_download(sandbox, "/tmp/down", host)


async def upload_dir_never_writes_through_links_in_its_root(
    sandbox: EnvironmentSession, host: Path
) -> None:
    """upload_dir to a link the workload made is refused; to a directory holding one, the
    link is replaced and its target left alone (`/etc` here, as root may link it)."""
    source = host / "src"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "corral-probe").write_text("upload")
    (source / "corral-probe").write_text("upload")
    await sh(sandbox, "mkdir -p /tmp/dst && ln -s /etc /tmp/dst/sub && ln -s / /tmp/to-root")
    with pytest.raises(UnsafeArchiveMember, match="/tmp/to-root"):
        await sandbox.upload_dir(source, "/tmp/to-root")
    await sandbox.upload_dir(source, "/tmp/dst")
    found = await sh(
        sandbox,
        "ls /corral-probe /etc/corral-probe 2>/dev/null; "
        "[ -L /tmp/dst/sub ] || cat /tmp/dst/sub/corral-probe",
    )
    assert found == "upload"
