"""Streamed tar packing and safe extraction, shared by every provider.

Packing yields the archive in chunks (a large file is read 1 MiB at a time, never whole).
Extraction lands the tree exactly at the requested root and refuses any member that
would land outside it: absolute or `..` names, links pointing out, devices.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Any, cast

from corral.errors import UnsafeArchiveMember

CHUNK = 1024 * 1024
_BLOCK = tarfile.BLOCKSIZE


def pack_dir(root: str | Path) -> Iterator[bytes]:
    """A tar of the contents of `root`, names relative to it, in chunks."""
    base = Path(root)
    for path, arcname in _walk(base):
        yield from _pack_member(path, arcname)
    yield b"\0" * (_BLOCK * 2)


def _walk(base: Path) -> Iterator[tuple[Path, str]]:
    if not base.is_dir():
        raise NotADirectoryError(f"not a directory: {str(base)!r}")
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        here = Path(dirpath)
        for name in [*dirnames, *sorted(filenames)]:
            path = here / name
            arcname = path.relative_to(base).as_posix()
            if path.is_symlink():
                _check_link(arcname, str(path.readlink()))
            elif not (path.is_dir() or path.is_file()):
                raise UnsafeArchiveMember(
                    f"{str(path)!r} is not a regular file, directory or symlink; "
                    "refusing to transfer it"
                )
            yield path, arcname


def validate_dir(root: str | Path) -> None:
    """Refuse, before anything is sent, a tree that `pack_dir` would refuse part-way."""
    for _ in _walk(Path(root)):
        pass


def pack_file(path: str | Path, arcname: str) -> Iterator[bytes]:
    """A tar holding one regular file under `arcname`, in chunks."""
    yield from _pack_member(Path(path), arcname)
    yield b"\0" * (_BLOCK * 2)


def _pack_member(path: Path, arcname: str) -> Iterator[bytes]:
    info = tarfile.TarInfo(arcname)
    st = path.lstat()
    info.mode = st.st_mode & 0o7777
    info.mtime = int(st.st_mtime)
    if path.is_symlink():
        info.type = tarfile.SYMTYPE
        info.linkname = str(path.readlink())
    elif path.is_dir():
        info.type = tarfile.DIRTYPE
    elif path.is_file():
        info.size = st.st_size
    else:
        raise UnsafeArchiveMember(f"{str(path)!r} is not a regular file, directory or symlink")
    yield info.tobuf(format=tarfile.PAX_FORMAT)
    if info.isfile():
        sent = 0
        with path.open("rb") as fh:
            while sent < info.size:
                chunk = fh.read(min(CHUNK, info.size - sent))
                if not chunk:
                    raise OSError(f"{str(path)!r} shrank while it was being transferred")
                sent += len(chunk)
                yield chunk
        if info.size % _BLOCK:
            yield b"\0" * (_BLOCK - info.size % _BLOCK)


def _check_link(name: str, target: str, *, from_root: bool = False) -> None:
    """Lexically: a symlink's target is relative to its directory, a hard link's to the root."""
    pure = PurePosixPath(target)
    if pure.is_absolute():
        raise UnsafeArchiveMember(f"link {name!r} -> {target!r} points to an absolute path")
    depth = 0 if from_root else len(PurePosixPath(name).parent.parts)
    for part in pure.parts:
        depth = depth - 1 if part == ".." else depth + (part != ".")
        if depth < 0:
            raise UnsafeArchiveMember(f"link {name!r} -> {target!r} points outside the root")


class _ChunkReader:
    """A read()-able view of an iterable of byte chunks, for tarfile's stream mode."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buffer = bytearray()

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buffer) < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buffer += chunk
        if size < 0:
            size = len(self._buffer)
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data


def extract_tar(chunks: Iterable[bytes], dest: str | Path, *, strip: str | None = None) -> None:
    """Extract a tar stream so that its tree lands exactly at `dest`.

    `strip` names a leading directory to remove (Docker's get_archive wraps the tree in
    its basename). Members are staged beside `dest` and moved in only when the whole
    archive was safe, so a refused archive leaves `dest` as it was.
    """
    target = Path(dest)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".corral-extract-", dir=target.parent))
    try:
        reader = cast(IO[bytes], _ChunkReader(chunks))
        with tarfile.open(fileobj=reader, mode="r|") as archive:
            for member in archive:
                name = _strip(member.name, strip)
                if name is None:
                    continue
                member.name = name
                if member.islnk():
                    linkname = _strip(member.linkname, strip)
                    member.linkname = linkname if linkname is not None else member.linkname
                _check_member(member, target)
                archive.extract(member, staging, **_NO_FILTER)
        _merge(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# The checks are corral's own (Python before 3.11.4 has no tarfile filters); the
# archive is then extracted as is, into a staging directory.
_NO_FILTER: dict[str, Any] = (
    {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
)


def _check_member(member: tarfile.TarInfo, target: Path) -> None:
    """Refuse what would land outside the root; drop special bits and foreign owners."""
    where = f"archive member {member.name!r} would land outside {str(target)!r}"
    pure = PurePosixPath(member.name)
    if pure.is_absolute() or ".." in pure.parts:
        raise UnsafeArchiveMember(where)
    if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
        raise UnsafeArchiveMember(f"{where}: it is a device or fifo")
    try:
        if member.issym():
            _check_link(member.name, member.linkname)
        elif member.islnk():
            _check_link(member.name, member.linkname, from_root=True)
    except UnsafeArchiveMember as exc:
        raise UnsafeArchiveMember(f"{where}: {exc}") from None
    member.mode &= 0o777
    member.uid, member.gid = os.getuid(), os.getgid()
    member.uname = member.gname = ""


def _strip(name: str, prefix: str | None) -> str | None:
    if prefix is None:
        return name
    parts = PurePosixPath(name).parts
    if not parts or parts[0] != prefix:
        raise UnsafeArchiveMember(f"archive member {name!r} is not under {prefix!r}")
    rest = parts[1:]
    return str(PurePosixPath(*rest)) if rest else None


def _merge(src: Path, dst: Path) -> None:
    if not dst.exists() and not dst.is_symlink():
        src.rename(dst)
        src.mkdir()
        return
    if not dst.is_dir() or dst.is_symlink():
        raise NotADirectoryError(f"destination {str(dst)!r} exists and is not a directory")
    for entry in src.iterdir():
        out = dst / entry.name
        if entry.is_dir() and not entry.is_symlink() and out.is_dir() and not out.is_symlink():
            _merge(entry, out)
        else:
            if out.is_dir() and not out.is_symlink():
                shutil.rmtree(out)
            entry.replace(out)


def extract_file(chunks: Iterable[bytes], dest: str | Path, remote: str) -> None:
    """Write the single regular file of a tar stream to `dest` (Docker's get_archive)."""
    target = Path(dest)
    reader = cast(IO[bytes], _ChunkReader(chunks))
    with tarfile.open(fileobj=reader, mode="r|") as archive:
        member = archive.next()
        if member is None or member.isdir():
            raise IsADirectoryError(f"sandbox path {remote!r} is a directory")
        if not member.isfile():
            raise UnsafeArchiveMember(f"sandbox path {remote!r} is not a regular file")
        source = archive.extractfile(member)
        assert source is not None
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.corral-partial")
        with partial.open("wb") as out:
            shutil.copyfileobj(source, out, CHUNK)
        partial.replace(target)
