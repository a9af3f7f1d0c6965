"""Contained path resolution: a relative path that cannot leave its root."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from corral.errors import ConfigError


def resolve_within(root: Path, relative: str) -> Path:
    """`root / relative`, refusing absolute paths, `..` and symlinks that escape `root`."""
    pure = PurePosixPath(relative)
    if not relative or pure.is_absolute() or ".." in pure.parts:
        raise ConfigError(
            f"path {relative!r} must be relative to {str(root)!r} and must not contain '..'"
        )
    resolved = (root / pure).resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise ConfigError(f"path {relative!r} escapes {str(root)!r} through a symlink")
    return resolved
