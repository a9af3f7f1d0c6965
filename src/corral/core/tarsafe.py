"""Streamed tar packing and safe extraction, shared by every provider.

Packing yields the archive in chunks (a large file is read 1 MiB at a time, never whole).

Extraction treats the archive as hostile (on Kubernetes it is whatever the Pod's `tar`
prints) and keeps one invariant: no member, link or chain of links creates, changes or
links to anything outside the destination. It holds because
- every member is created through directory descriptors opened with O_NOFOLLOW, so no
  member's path (nor a hard link's target) passes through a symlink, whether the archive
  made it earlier or it was already in the destination: such a member is refused;
- a file is always a new inode (what was at its place is unlinked first), so no member
  writes through an existing hard link; a hard link may only name a regular file this
  archive extracted;
- a symlink's target is `..` components, then names, with no more `..` than the link is
  deep (`_link_fault`). Resolved from the link's directory, which is a real directory,
  it climbs through real directories and then only descends, and descending through
  other links of that form cannot leave the root either: chains of them stay inside,
  and so do links that earlier downloads landed in the same destination.
Members are staged beside the destination and merged in only when the whole archive
passed, so a refused archive leaves the destination as it was; the merge replaces what
is in its way, symlinks included, and never follows them.
"""

from __future__ import annotations

import errno
import io
import os
import secrets
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path, PurePosixPath
from typing import IO, BinaryIO, cast

from corral.core.treelimits import Tally
from corral.errors import RemotePathNotFound, TransferLimitExceeded, UnsafeArchiveMember

CHUNK = 1024 * 1024
_BLOCK = tarfile.BLOCKSIZE
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: how many directories on a member's way extraction keeps open for the next member
_CHAIN_DEPTH = 16
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def owned_by_root(
    files: Mapping[str, tuple[bytes, int]], dirs: Mapping[str, int] | None = None
) -> bytes:
    """A small tar in memory: `dirs` (name: mode), then `files` (name: (bytes, mode)),
    every member root's. How corral's own programs are put where the workload cannot
    write them (the programs volume, the holder, a Pod's probe container)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        members = [(name, None, mode) for name, mode in (dirs or {}).items()]
        members += [(name, data, mode) for name, (data, mode) in files.items()]
        for name, data, mode in members:
            info = tarfile.TarInfo(name)
            info.mode, info.uid, info.gid, info.uname, info.gname = mode, 0, 0, "root", "root"
            if data is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            else:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


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
                target = str(path.readlink())
                fault = _link_fault(PurePosixPath(arcname).parts, target)
                if fault is not None:
                    raise UnsafeArchiveMember(f"link {arcname!r} -> {target!r} {fault}")
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


def _link_fault(name: Sequence[str], target: str) -> str | None:
    """Why a symlink at `name` (components under the root) to `target` is refused, if it is.

    Only leading `..` are allowed: after a name, `..` climbs from wherever that name
    resolves to (`d/..` with `d -> .` is the root's parent), which no lexical count sees.
    """
    if not target or "\0" in target:
        return "has an empty or invalid target"
    if target.startswith("/"):
        return "points to an absolute path"
    parts = [part for part in target.split("/") if part not in ("", ".")]
    ups = next((i for i, part in enumerate(parts) if part != ".."), len(parts))
    if ".." in parts[ups:]:
        return "climbs with '..' after a name; only leading '..' are allowed"
    if ups > len(name) - 1:
        return "points outside the root"
    return None


class _ChunkReader:
    """A read()-able view of an iterable of byte chunks, for tarfile's stream mode."""

    def __init__(self, chunks: Iterable[bytes], tally: Tally | None = None) -> None:
        self._chunks = iter(chunks)
        self._buffer = bytearray()
        self._tally = tally

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._buffer) < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            if self._tally is not None:
                # Before buffering: a header that claims gigabytes is refused, not read.
                self._tally.archive(len(chunk))
            self._buffer += chunk
        if size < 0:
            size = len(self._buffer)
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data


def extract_tar(chunks: Iterable[bytes], dest: str | Path, *, strip: str | None = None) -> None:
    """Extract a tar stream so that its tree lands exactly at `dest`.

    `strip` names a leading directory to remove (Docker's get_archive wraps the tree in
    its basename). Links and chains of links that could reach outside `dest` are refused
    (see the module's docstring); a refused archive leaves `dest` as it was. Inside
    `treelimits.bounded(...)`, an archive over a limit is refused at the first member or
    byte over it.
    """
    target = Path(dest)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".corral-extract-", dir=target.parent))
    tally = Tally.current(f"the tree for {str(target)!r}")
    try:
        with _Staging(staging, target) as tree:
            reader = cast(IO[bytes], _ChunkReader(chunks, tally))
            with tarfile.open(fileobj=reader, mode="r|") as archive:
                for member in archive:
                    name = _strip(member.name, strip)
                    if name is None:
                        continue
                    if tally is not None:
                        tally.entry(name, member.size if member.isfile() else 0)
                    link = (_strip(member.linkname, strip) or "") if member.islnk() else ""
                    tree.add(archive, member, name, link)
            tree.finish()
        _merge(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _strip(name: str, prefix: str | None) -> str | None:
    if prefix is None:
        return name
    parts = PurePosixPath(name).parts
    if not parts or parts[0] != prefix:
        raise UnsafeArchiveMember(f"archive member {name!r} is not under {prefix!r}")
    rest = parts[1:]
    return str(PurePosixPath(*rest)) if rest else None


class _Staging:
    """The archive's tree, built in a fresh directory through no-follow descriptors only."""

    def __init__(self, root: Path, dest: Path) -> None:
        self.dest = str(dest)
        self.fd = os.open(root, _DIRECTORY)
        # Modes and mtimes of directories, set once everything inside them is written.
        self.dirs: dict[tuple[str, ...], tuple[int, float]] = {}
        # The directories on the way to the last member's parent, each name with its
        # descriptor: members come directory by directory, so the next one's way mostly
        # starts the same. A descriptor kept stays that directory's: nothing in the
        # staging tree but this extraction writes, and it never removes a directory.
        self.chain: list[tuple[str, int]] = []
        # Below _CHAIN_DEPTH, the last member's parent alone (a hostile archive's depth
        # must not become as many open descriptors).
        self.tail: int | None = None

    def __enter__(self) -> _Staging:
        return self

    def __exit__(self, *exc: object) -> None:
        self._drop_tail()
        self._cut(0)
        os.close(self.fd)

    def _cut(self, depth: int) -> None:
        while len(self.chain) > depth:
            os.close(self.chain.pop()[1])

    def parent_of(self, name: str, parts: Sequence[str]) -> int:
        """A descriptor of the directory at `parts`, created as needed and reached without
        following a symlink; valid until the next call."""
        self._drop_tail()
        kept = parts[:_CHAIN_DEPTH]
        same = 0
        while same < min(len(kept), len(self.chain)) and self.chain[same][0] == kept[same]:
            same += 1
        self._cut(same)
        for depth in range(same, len(kept)):
            fd = self.chain[-1][1] if self.chain else self.fd
            self.chain.append((kept[depth], self._step(name, parts, depth, fd, create=True)))
        fd = self.chain[-1][1] if self.chain else self.fd
        if len(parts) > _CHAIN_DEPTH:
            self.tail = self._walk(name, parts, _CHAIN_DEPTH, fd, create=True)
            return self.tail
        return fd

    def _drop_tail(self) -> None:
        if self.tail is not None:
            os.close(self.tail)
            self.tail = None

    def _walk(self, name: str, parts: Sequence[str], start: int, fd: int, *, create: bool) -> int:
        """A new descriptor of `parts`, walked from `fd` (at `parts[:start]`) one no-follow
        step at a time; the caller closes it."""
        fd = os.dup(fd)
        try:
            for depth in range(start, len(parts)):
                child = self._step(name, parts, depth, fd, create=create)
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _step(self, name: str, parts: Sequence[str], depth: int, fd: int, *, create: bool) -> int:
        """The directory `parts[depth]` in `fd` (created if `create`), opened without
        following a symlink."""
        part = parts[depth]
        if create:
            with suppress(FileExistsError):
                os.mkdir(part, 0o777, dir_fd=fd)
        try:
            return os.open(part, _DIRECTORY, dir_fd=fd)
        except OSError:
            kind = _kind(_lstat(part, fd))
            where = "/".join(parts[: depth + 1])
            raise self.refuse(name, f"{where!r} on its way is {kind}") from None

    def refuse(self, name: str, why: str) -> UnsafeArchiveMember:
        return UnsafeArchiveMember(
            f"archive member {name!r} would land outside {self.dest!r}: {why}"
        )

    def parts(self, name: str, path: str) -> tuple[str, ...]:
        pure = PurePosixPath(path)
        if "\0" in path or pure.is_absolute() or ".." in pure.parts:
            raise self.refuse(name, f"{path!r} is absolute or climbs with '..'")
        return pure.parts

    @contextmanager
    def directory(self, name: str, parts: Sequence[str], *, create: bool) -> Generator[int]:
        """A descriptor of the directory at `parts`, reached without following a symlink."""
        fd = self._walk(name, parts, 0, self.fd, create=create)
        try:
            yield fd
        finally:
            os.close(fd)

    def add(self, archive: tarfile.TarFile, member: tarfile.TarInfo, path: str, link: str) -> None:
        name = member.name
        if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
            raise self.refuse(name, "it is a device or fifo")
        parts = self.parts(name, path)
        if member.isdir():
            self.dirs[parts] = (member.mode & 0o777, member.mtime)
        if not parts:
            if not member.isdir():
                raise self.refuse(name, "the root itself must be a directory")
            return
        *parents, leaf = parts
        parent = self.parent_of(name, parents)
        existing = _lstat(leaf, parent)
        if existing is not None and stat.S_ISDIR(existing.st_mode):
            if member.isdir():
                return
            raise UnsafeArchiveMember(
                f"archive member {name!r} would replace the directory it names; "
                "refusing the archive"
            )
        if member.issym():
            fault = _link_fault(parts, member.linkname)
            if fault is not None:
                raise self.refuse(name, f"link to {member.linkname!r} {fault}")
        if member.islnk():
            self.hardlink(name, link, parent, leaf)
            return
        if existing is not None:
            os.unlink(leaf, dir_fd=parent)
        if member.isdir():
            os.mkdir(leaf, 0o777, dir_fd=parent)
        elif member.issym():
            os.symlink(member.linkname, leaf, dir_fd=parent)
        else:
            self.write(archive, member, parent, leaf)

    def hardlink(self, name: str, link: str, parent: int, leaf: str) -> None:
        """Link to a regular file this archive extracted; nothing else is linkable."""
        refusal = self.refuse(name, f"hard link to {link!r}, not a file the archive extracted")
        parts = self.parts(name, link)
        if not parts:
            raise refusal
        *where, target = parts
        with self.directory(name, where, create=False) as directory:
            source = _lstat(target, directory)
            if source is None or not stat.S_ISREG(source.st_mode):
                raise refusal
            existing = _lstat(leaf, parent)
            if existing is not None:
                if os.path.samestat(existing, source):
                    return
                os.unlink(leaf, dir_fd=parent)
            os.link(target, leaf, src_dir_fd=directory, dst_dir_fd=parent, follow_symlinks=False)

    def write(
        self, archive: tarfile.TarFile, member: tarfile.TarInfo, parent: int, leaf: str
    ) -> None:
        source = archive.extractfile(member)
        assert source is not None, "a regular member always has a file object"
        with os.fdopen(os.open(leaf, _NEW_FILE, 0o600, dir_fd=parent), "wb") as out:
            shutil.copyfileobj(source, out, CHUNK)
            out.flush()
            os.fchmod(out.fileno(), member.mode & 0o777)
            os.utime(out.fileno(), (member.mtime, member.mtime))

    def finish(self) -> None:
        """Set directory modes and mtimes, deepest first (writing inside changes them)."""
        for parts in sorted(self.dirs, key=len, reverse=True):
            mode, mtime = self.dirs[parts]
            with self.directory("/".join(parts) or ".", parts, create=False) as fd:
                os.fchmod(fd, mode)
                os.utime(fd, (mtime, mtime))


def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _kind(entry: os.stat_result | None) -> str:
    if entry is None:
        return "missing"
    if stat.S_ISDIR(entry.st_mode):
        return "a directory it cannot open"
    return "a symlink" if stat.S_ISLNK(entry.st_mode) else "not a directory"


@contextmanager
def _opened(name: str | Path, dir_fd: int | None = None) -> Generator[int]:
    fd = os.open(name, _DIRECTORY, dir_fd=dir_fd)
    try:
        yield fd
    finally:
        os.close(fd)


def _merge(src: Path, dst: Path) -> None:
    """Move the staged tree into `dst`: what is in the way is replaced, never followed."""
    if not dst.exists() and not dst.is_symlink():
        src.rename(dst)
        src.mkdir()
        return
    if not dst.is_dir() or dst.is_symlink():
        raise NotADirectoryError(f"destination {str(dst)!r} exists and is not a directory")
    src.chmod(0o700)  # the archive may have made it read-only; it is emptied, then removed
    with _opened(src) as ours, _opened(dst) as theirs:
        _merge_into(ours, theirs)


def _merge_into(src: int, dst: int) -> None:
    for name in os.listdir(src):
        ours = os.stat(name, dir_fd=src, follow_symlinks=False)
        theirs = _lstat(name, dst)
        if theirs is not None and stat.S_ISDIR(theirs.st_mode):
            if stat.S_ISDIR(ours.st_mode):
                os.chmod(name, 0o700, dir_fd=src)
                with _opened(name, src) as inner_src, _opened(name, dst) as inner_dst:
                    _merge_into(inner_src, inner_dst)
                continue
            shutil.rmtree(name, dir_fd=dst)
        elif theirs is not None and stat.S_ISDIR(ours.st_mode):
            os.unlink(name, dir_fd=dst)  # a directory cannot be renamed over a non-directory
        os.rename(name, name, src_dir_fd=src, dst_dir_fd=dst)


@contextmanager
def replacing(dest: str | Path) -> Generator[BinaryIO]:
    """A new file beside `dest`, renamed over it if the block succeeds, removed if not.

    The file is created afresh (O_EXCL, a random name) and renamed into place, so what
    was at `dest`, a symlink included, is replaced, never followed or written through.
    The directories leading to `dest` are the caller's choice and are taken as given.
    """
    target = Path(dest)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{secrets.token_hex(4)}.corral-partial")
    try:
        with os.fdopen(os.open(partial, _NEW_FILE, 0o666), "wb") as out:
            yield out
        partial.replace(target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def extract_file(
    chunks: Iterable[bytes], dest: str | Path, remote: str, max_bytes: int | None
) -> None:
    """Write the single regular file of a tar stream to `dest` (Docker's get_archive).

    A link (symbolic or hard) is refused, not followed; `dest` is replaced (`replacing`).
    A file over `max_bytes` is refused before any of it is read (`file_limit`).
    """
    reader = cast(IO[bytes], _ChunkReader(chunks))
    with tarfile.open(fileobj=reader, mode="r|") as archive:
        member = archive.next()
        if member is None or member.isdir():
            raise IsADirectoryError(f"sandbox path {remote!r} is a directory")
        if not member.isfile():
            raise UnsafeArchiveMember(f"sandbox path {remote!r} is not a regular file")
        file_limit(remote, member.size, max_bytes)
        source = archive.extractfile(member)
        assert source is not None, "a regular member always has a file object"
        with replacing(dest) as out:
            shutil.copyfileobj(source, out, CHUNK)


#: how corral opens a sandbox's file to read it: a symlink at the path is refused, a FIFO
#: cannot block the open, a terminal never becomes the controlling one
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


def open_regular(path: Path, remote: str) -> BinaryIO:
    """`path` (the sandbox's `remote`) open for reading, whatever was planted there: only a
    regular file, judged by the descriptor that is read, never through a link at `path`."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        raise RemotePathNotFound(remote) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeArchiveMember(
                f"sandbox path {remote!r} is a symlink; corral reads no file through one"
            ) from None
        raise
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode):
        return os.fdopen(fd, "rb")
    os.close(fd)
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(f"sandbox path {remote!r} is a directory")
    kind = _KINDS.get(stat.S_IFMT(mode), "something else")
    raise UnsafeArchiveMember(f"sandbox path {remote!r} is not a regular file ({kind})")


def copy_at_most(source: BinaryIO, out: BinaryIO, size: int) -> None:
    """Copy `size` bytes at most (what grows past a measured size is not copied)."""
    while size > 0:
        chunk = source.read(min(CHUNK, size))
        if not chunk:
            return
        out.write(chunk)
        size -= len(chunk)


def file_limit(remote: str, size: int, max_bytes: int | None) -> None:
    """Refuse a file of `size` bytes (as corral's side measured it) over `max_bytes`."""
    if max_bytes is not None and size > max_bytes:
        raise TransferLimitExceeded(
            f"sandbox path {remote!r} holds {size} bytes, over the limit of {max_bytes} "
            "(max_bytes); nothing was written"
        )
