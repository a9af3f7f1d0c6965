"""corral's own programs for the sandbox container, from where the workload cannot write.

Everything corral runs inside the sandbox (its main process, the exec channel's helper,
the runtime probe) comes from one volume of the session's: mounted read-write in the
holder only, corral's own container, and read-only at `MOUNT` in the sandbox. Filling it
goes through the holder (`put_archive`), never through the sandbox's filesystem, so a
root workload without CAP_SYS_ADMIN can neither replace these files nor mount over them,
and a snapshot (`docker commit`) carries none of them: a fork gets a fresh copy.

The volume holds the holder image's static busybox (its `sh`, `sleep` and `date` are the
sandbox's idle main process, its `nc` the runtime probe) and, where this installation has
one for the engine's architecture, the exec channel's helper.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

from docker.errors import APIError

from corral.core.tarsafe import owned_by_root
from corral.errors import ProviderError
from corral.helper import helper_binary
from corral.providers.docker.engine import Engine

#: where the sandbox sees corral's programs (read-only)
MOUNT = "/.corral"
BUSYBOX = f"{MOUNT}/busybox"
HELPER = f"{MOUNT}/corral-exec"
#: corral's shell for its own scripts in the sandbox (busybox prefers its own applets)
SHELL = (BUSYBOX, "sh")
#: the holder image's static busybox
_SOURCE = "/bin/busybox"

#: the filled archive, by (holder image id, helper path, size, mtime): it is the same for
#: every session of one holder image, and rebuilding it would cost each open a read.
_archives: dict[tuple[str, str, int, int], bytes] = {}


def helper(arch: str) -> Path | None:
    """The exec channel's helper for the engine's `arch`, if this installation has one."""
    return helper_binary(arch)


def main_process(expires_at: str) -> list[str]:
    """The sandbox's main process: corral's busybox idling until `expires_at` (epoch s).

    The wait is counted again at every start, so a restart (`end_workload`) keeps the
    deadline; started past it, it exits at once. Nothing of the image runs.
    """
    script = f'exec {BUSYBOX} sleep "$(( $1 - $({BUSYBOX} date +%s) ))"'
    return [BUSYBOX, "sh", "-c", script, "corral-lifetime", expires_at]


def bind(volume: str, *, writable: bool) -> str:
    """The volume at MOUNT: read-write for the holder only, read-only everywhere else."""
    return f"{volume}:{MOUNT}:{'rw' if writable else 'ro'}"


async def fill(engine: Engine, holder: dict[str, Any], arch: str) -> None:
    """Put corral's programs into the volume through the (running) holder."""
    binary = helper(arch)
    stat = binary.stat() if binary is not None else None
    key = (
        str(holder["Image"]),
        str(binary),
        stat.st_size if stat else 0,
        stat.st_mtime_ns if stat else 0,
    )
    archive = _archives.get(key)
    if archive is None:
        busybox = await _read_busybox(engine, holder["Id"])
        helper_bytes = binary.read_bytes() if binary is not None else None
        archive = _archive(busybox, helper_bytes)
        _archives.clear()
        _archives[key] = archive
    try:
        await engine.call(engine.api.put_archive, holder["Id"], MOUNT, archive)
    except APIError as exc:
        raise ProviderError(f"putting corral's programs into the holder failed: {exc}") from None


async def _read_busybox(engine: Engine, holder: str) -> bytes:
    def read() -> bytes:
        stream, _ = engine.api.get_archive(holder, _SOURCE)
        raw = b"".join(stream)
        with tarfile.open(fileobj=io.BytesIO(raw)) as source:
            member = source.next()
            body = source.extractfile(member) if member is not None else None
            if body is None:
                raise ProviderError(f"corral's holder image has no {_SOURCE}")
            return body.read()

    try:
        return await engine.idempotent(read)
    except APIError as exc:
        raise ProviderError(f"reading {_SOURCE} from corral's holder failed: {exc}") from None


def _archive(busybox: bytes, helper_bytes: bytes | None) -> bytes:
    """Root-owned, mode 0555: readable and runnable by every user of the sandbox."""
    files = {"busybox": (busybox, 0o555)}
    if helper_bytes is not None:
        files["corral-exec"] = (helper_bytes, 0o555)
    return owned_by_root(files)
