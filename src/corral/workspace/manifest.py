"""What a tree holds, path by path, read without following a link: the basis of every
revision, change set and conflict decision a binding makes."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from corral.core.tarsafe import CHUNK
from corral.core.treelimits import Tally, TreeLimits
from corral.errors import ConfigError
from corral.workspace.patterns import matches

_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


@dataclass(frozen=True)
class Entry:
    """`kind` is `d`, `f` or `l`; `detail` the content hash and exec bit, or the link's target."""

    kind: str
    detail: str = ""
    size: int = 0


@dataclass(frozen=True)
class Manifest:
    entries: Mapping[str, Entry] = field(default_factory=dict[str, Entry])

    @property
    def files(self) -> int:
        return len(self.entries)

    @property
    def bytes(self) -> int:
        return sum(entry.size for entry in self.entries.values())

    def digest(self) -> str:
        hasher = hashlib.sha256()
        for path in sorted(self.entries):
            entry = self.entries[path]
            hasher.update(f"{path}\0{entry.kind}\0{entry.detail}\n".encode())
        return hasher.hexdigest()

    def differing(self, other: Manifest) -> list[str]:
        """Paths whose entry is not the same in both, sorted."""
        paths = self.entries.keys() | other.entries.keys()
        return sorted(p for p in paths if self.entries.get(p) != other.entries.get(p))


def scan(
    root: Path,
    pattern: str,
    *,
    limits: TreeLimits | None = None,
    copy_to: Path | None = None,
) -> Manifest:
    """The entries of `root` that match `pattern` (and the directories leading to them).

    With `limits`, the first entry over one is refused; with `copy_to`, each entry is also
    copied there, and what is recorded is what was copied. Anything but a directory,
    regular file or symlink is refused by name.
    """
    tally = None if limits is None else Tally(limits, f"the tree at {str(root)!r}")
    entries: dict[str, Entry] = {}
    for relative, info in _walk(root):
        if not matches(pattern, relative):
            continue
        for parent in reversed(PurePosixPath(relative).parents):
            name = parent.as_posix()
            if name != "." and name not in entries:
                entries[name] = Entry("d")
                _copy_dir(copy_to, name)
        entry = _entry(root / relative, relative, info, tally, copy_to)
        entries[relative] = entry
    return Manifest(entries)


def _walk(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    top = root.lstat()
    if not stat.S_ISDIR(top.st_mode):
        raise NotADirectoryError(f"not a directory: {str(root)!r}")
    pending = [""]
    while pending:
        directory = pending.pop()
        names = sorted(entry.name for entry in (root / directory).iterdir())
        for name in names:
            relative = f"{directory}/{name}" if directory else name
            info = os.lstat(root / relative)
            yield relative, info
            if stat.S_ISDIR(info.st_mode):
                pending.append(relative)


def _entry(
    path: Path, relative: str, info: os.stat_result, tally: Tally | None, copy_to: Path | None
) -> Entry:
    mode = info.st_mode
    if stat.S_ISDIR(mode):
        if tally is not None:
            tally.entry(relative, 0)
        _copy_dir(copy_to, relative)
        return Entry("d")
    if stat.S_ISLNK(mode):
        if tally is not None:
            tally.entry(relative, 0)
        target = str(path.readlink())
        if copy_to is not None:
            (copy_to / relative).symlink_to(target)
        return Entry("l", target)
    if not stat.S_ISREG(mode):
        raise ConfigError(
            f"{str(path)!r} is not a regular file, directory or symlink; "
            "leave it out with the binding's pattern"
        )
    if tally is not None:
        tally.entry(relative, info.st_size)
    executable = bool(mode & stat.S_IXUSR)
    copy = None if copy_to is None else copy_to / relative
    digest = _hash(path, info.st_size, copy, executable)
    return Entry("f", f"{digest}:{'x' if executable else '-'}", info.st_size)


def _copy_dir(copy_to: Path | None, relative: str) -> None:
    if copy_to is not None:
        (copy_to / relative).mkdir(exist_ok=True)


def _hash(path: Path, size: int, copy: Path | None, executable: bool) -> str:
    """Hash (and copy) exactly the `size` bytes counted against the limits."""
    hasher = hashlib.sha256()
    read = 0
    fd = os.open(path, _READ)
    with os.fdopen(fd, "rb") as source:
        out = None if copy is None else copy.open("xb")
        try:
            while chunk := source.read(min(CHUNK, size - read + 1)):
                read += len(chunk)
                if read > size:
                    raise ConfigError(f"{str(path)!r} grew while it was read; try again")
                hasher.update(chunk)
                if out is not None:
                    out.write(chunk)
        finally:
            if out is not None:
                out.close()
    if read != size:
        raise ConfigError(f"{str(path)!r} shrank while it was read; try again")
    if copy is not None:
        copy.chmod(0o755 if executable else 0o644)
    return hasher.hexdigest()
