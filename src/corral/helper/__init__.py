"""The exec channel's helper binary, shipped as package data.

`corral-exec` is a small static program (Go, no cgo; source in `helper/` at the root of
the repository) that the Docker provider copies into a sandbox and starts once, to spawn
each later exec without paying the engine's exec cost. `helper/build.sh` builds it into
`bin/` here; a wheel built after that carries it. Installing corral never compiles it:
where the binary for a sandbox's architecture is absent, exec falls back to the plain
engine path and the logs say so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Generic, TypeVar

from corral.core.tarsafe import owned_by_root

BIN_DIR = Path(__file__).parent / "bin"

#: engine architecture names (`docker version` Arch, uname -m) -> Go's
_ARCHES = {"amd64": "amd64", "x86_64": "amd64", "arm64": "arm64", "aarch64": "arm64"}


def helper_binary(arch: str) -> Path | None:
    """The helper for Linux on `arch`, or None if this installation has none."""
    goarch = _ARCHES.get(arch.lower())
    if goarch is None:
        return None
    path = BIN_DIR / f"corral-exec-linux-{goarch}"
    return path if path.is_file() else None


def no_helper(arch: str) -> str:
    """The one line that says this installation has no helper for Linux on `arch`."""
    return (
        f"this corral has no helper for linux/{arch or '?'} (its wheel is for another "
        "platform, or it was built without Go): install the wheel for linux/"
        f"{_ARCHES.get(arch.lower(), arch)} or the any-platform one, or run "
        "`bash helper/build.sh` in a checkout"
    )


def helper_shipped() -> bool:
    """Whether this installation carries the helper for any architecture."""
    return any(BIN_DIR.glob("corral-exec-linux-*"))


T = TypeVar("T")


class WithHelper(Generic[T]):
    """A provider's declaration of what needs corral's helper (the resolver of allowlisted
    names, the refusal reader, the process manager), made only where this installation
    carries it: a wheel or checkout without it must not advertise what would fail."""

    def __init__(self, present: T, absent: T) -> None:
        self.present, self.absent = present, absent

    def __get__(self, obj: object, owner: type | None = None) -> T:
        return self.present if helper_shipped() else self.absent


def helper_archive(binary: Path, name: str) -> bytes:
    """A tar holding only the helper, as `name`, owned by root, mode 0755 (blocking)."""
    return owned_by_root({name: (binary.read_bytes(), 0o755)})
