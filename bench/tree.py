"""The directory tree the transfer cases move (Docker and Kubernetes alike): 2,000 files,
50 MB, made once per run in the run's workspace; and the floor of a download extracted in
Python, which both cases time."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from bench.context import Context
from bench.stats import Summary

FILES = 2000
TOTAL_BYTES = 50 * 1000 * 1000
PER_DIR = 100
#: How the transfer rows name the tree.
LABEL = "2,000 files / 50 MB"
#: What each transfer case times per repetition: corral and the CLI each way, and the
#: floor of a download extracted in Python.
SAMPLES = ("up", "up-cp", "down", "down-cp", "down-tarfile")


def make_tree(root: Path) -> None:
    """2,000 incompressible files in 20 directories, 50 MB in all."""
    size = TOTAL_BYTES // FILES
    for index in range(FILES):
        folder = root / f"d{index // PER_DIR:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{index:04d}.bin").write_bytes(os.urandom(size))


def workspace_tree(ctx: Context) -> Path:
    """The run's tree, made on first use."""
    root = ctx.workspace / "tree"
    if not root.exists():
        make_tree(root)
    return root


def throughput(summary: Summary) -> str:
    return f"{TOTAL_BYTES / summary.median / 1e6:.0f} MB/s"


class _Chunks(io.RawIOBase):
    """An archive arriving in chunks, as the file `tarfile` reads a stream from."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._left = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._left:
            self._left = next(self._chunks, b"")
            if not self._left:
                return 0
        size = min(len(buffer), len(self._left))
        buffer[:size] = self._left[:size]
        self._left = self._left[size:]
        return size


def tarfile_extract(chunks: Iterable[bytes], dest: Path) -> None:
    """Python's own `tarfile` extracting a download's archive (its `data` filter; none of
    corral's checks or staging): the floor of extracting in Python."""
    with tarfile.open(fileobj=_Chunks(chunks), mode="r|") as archive:
        archive.extractall(dest, filter="data")
