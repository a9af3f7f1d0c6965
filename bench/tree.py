"""The directory tree the transfer cases move (Docker and Kubernetes alike): 2,000 files,
50 MB, made once per run in the run's workspace."""

from __future__ import annotations

import os
from pathlib import Path

from bench.context import Context
from bench.stats import Summary

FILES = 2000
TOTAL_BYTES = 50 * 1000 * 1000
PER_DIR = 100
#: How the transfer rows name the tree.
LABEL = "2,000 files / 50 MB"


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
