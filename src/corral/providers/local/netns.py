"""`no-network` on the host: each exec in a fresh network namespace, if the host allows.

Root makes one directly. Any other user makes it inside a new user namespace where it is
root (so it may bring up the namespace's loopback), then maps itself back to its own uid
and gid in a second one, so the command runs as the user it would have been.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

_LO_UP = 'ip link set lo up 2>/dev/null; exec "$@"'


def _unshare_net() -> list[str]:
    if os.geteuid() == 0:
        return ["unshare", "--net", "--"]
    return ["unshare", "--user", "--map-root-user", "--net", "--"]


@functools.cache
def netns_available() -> bool:
    """Probe once whether a network namespace can be made here (root, or user namespaces)."""
    if shutil.which("unshare") is None:
        return False
    try:
        done = subprocess.run(
            [*_unshare_net(), "true"], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def isolated(argv: list[str]) -> list[str]:
    """`argv` in a new network namespace with only a loopback interface."""
    if os.geteuid() == 0:
        return [*_unshare_net(), "sh", "-c", _LO_UP, "sh", *argv]
    back = ["unshare", "--user", f"--map-user={os.geteuid()}", f"--map-group={os.getegid()}"]
    return [*_unshare_net(), "sh", "-c", _LO_UP, "sh", *back, "--", *argv]
