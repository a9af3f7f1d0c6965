"""Bounds on a directory transfer, checked member by member while the archive streams.

A provider's `download_dir` extracts whatever the sandbox sends; a caller that must not
take more than it can hold (a workspace binding syncing back) sets limits around the call
with `bounded(limits)`. `extract_tar` counts every member against them before writing it
and every raw byte before parsing it, and stops at the first one over: the archive is
refused, and its destination left as it was. Worker threads see the limits because anyio
runs them in a copy of the caller's context.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from contextvars import ContextVar

from pydantic import BaseModel, ConfigDict, Field

from corral.errors import TransferLimitExceeded

MIB = 1024 * 1024


class TreeLimits(BaseModel):
    """How much one transfer may carry; None turns a bound off."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_files: int | None = Field(
        default=10_000, ge=1, description="entries (files, directories, links) in the tree"
    )
    max_file_bytes: int | None = Field(default=None, ge=0, description="bytes of one file")
    max_total_bytes: int | None = Field(
        default=256 * MIB, ge=0, description="bytes of all files together"
    )
    max_archive_bytes: int | None = Field(
        default=320 * MIB,
        ge=0,
        description="raw bytes of the tar stream (headers, padding and file data)",
    )


DEFAULT_LIMITS = TreeLimits()

_current: ContextVar[TreeLimits | None] = ContextVar("corral_tree_limits", default=None)


@contextmanager
def bounded(limits: TreeLimits) -> Generator[None]:
    """Directory transfers started inside the block are held to `limits`."""
    token = _current.set(limits)
    try:
        yield
    finally:
        _current.reset(token)


class Tally:
    """Running totals of one transfer, refusing the first entry or byte over a limit."""

    def __init__(self, limits: TreeLimits, what: str) -> None:
        self.limits = limits
        self.what = what
        self.files = 0
        self.total_bytes = 0
        self.archive_bytes = 0

    @classmethod
    def current(cls, what: str) -> Tally | None:
        limits = _current.get()
        return None if limits is None else cls(limits, what)

    def entry(self, name: str, size: int) -> None:
        """Count one entry of `size` bytes (0 for directories and links)."""
        limits = self.limits
        self.files += 1
        self.total_bytes += size
        if limits.max_files is not None and self.files > limits.max_files:
            self._refuse(f"has more than max_files={limits.max_files} entries (at {name!r})")
        if limits.max_file_bytes is not None and size > limits.max_file_bytes:
            self._refuse(
                f"holds {name!r} of {size} bytes, over max_file_bytes={limits.max_file_bytes}"
            )
        if limits.max_total_bytes is not None and self.total_bytes > limits.max_total_bytes:
            self._refuse(f"holds more than max_total_bytes={limits.max_total_bytes} (at {name!r})")

    def archive(self, size: int) -> None:
        """Count `size` raw bytes of the stream."""
        self.archive_bytes += size
        limit = self.limits.max_archive_bytes
        if limit is not None and self.archive_bytes > limit:
            self._refuse(f"streams more than max_archive_bytes={limit}")

    def _refuse(self, why: str) -> None:
        raise TransferLimitExceeded(f"{self.what} {why}; nothing was written")
