"""Bind mounts: `host:container[:ro|rw]`, and the host paths that hand the host over.

A bind of `/`, of the engine's socket, of `/proc`, `/etc` or Docker's data gives the
sandbox the host (or root on it); so do their parents. Those need the mount to be named
in `unsafe_mounts`. System code directories (`/usr`, `/bin`, `/lib`, ...) may be bound
read-only: writable, they would let the sandbox replace what the host runs. Other host
paths (a workspace) may be bound read-write; no mount is forced to `:ro`, since a
workspace is what mounts are for.

Paths are judged as written and, where they exist on this machine, with symlinks resolved
(`/var/run` is `/run`); any socket is refused (the engine's own may live anywhere). For a
remote engine only the written path says anything.
"""

from __future__ import annotations

import posixpath
import re
import stat
from pathlib import Path
from typing import NamedTuple

#: Never bound without an opt-in, nor anything under them or above them.
EXPOSING = (
    "/proc",
    "/sys",
    "/dev",
    "/etc",
    "/boot",
    "/root",
    "/run",
    "/var/run",
    "/var/lib/docker",
    "/var/lib/containerd",
    "/var/lib/kubelet",
)
#: Bound read-only only (the host runs what is in them).
HOST_CODE = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")

_VOLUME_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]+")


class Mount(NamedTuple):
    host: str
    container: str
    mode: str


def parse_mount(text: str) -> Mount:
    """`host:container[:ro|rw]`; a host that is not a path is a Docker volume name."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise ValueError(f"mount {text!r} must be host:container[:ro|rw]")
    host, container = parts[0], parts[1]
    if not host.startswith("/") and not _VOLUME_NAME.fullmatch(host):
        raise ValueError(f"mount {text!r}: {host!r} is neither an absolute path nor a volume")
    if not container.startswith("/"):
        raise ValueError(f"mount {text!r}: the container path must be absolute")
    return Mount(host, container, parts[2] if len(parts) == 3 else "rw")


def hazard(mount: Mount) -> str | None:
    """Why binding `mount` exposes the host, or None."""
    if not mount.host.startswith("/"):
        return None
    written = _normal(mount.host)
    for path in dict.fromkeys((written, _resolved(written))):
        if _is_socket(path):
            return f"{path} is a socket"
        for exposing in EXPOSING:
            if _within(path, exposing):
                return f"{path} is in {exposing}"
            if _within(exposing, path):
                return f"{path} holds {exposing}"
        for code in HOST_CODE:
            if _within(path, code) and mount.mode != "ro":
                return f"{path} is in {code}, which the host runs; bind it with :ro"
    return None


def _normal(path: str) -> str:
    # POSIX keeps a leading '//' apart; the kernel does not.
    return posixpath.normpath("/" + path.lstrip("/"))


def _resolved(path: str) -> str:
    try:
        return str(Path(path).resolve())
    except OSError:  # a link this process may not follow: the written path is judged
        return path


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(Path(path).stat().st_mode)
    except OSError:
        return False
