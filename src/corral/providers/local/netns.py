"""`no-network` on the host: each exec in a fresh network namespace, if the host allows."""

from __future__ import annotations

import functools
import shutil
import subprocess

_LO_UP = 'ip link set lo up 2>/dev/null; exec "$@"'


@functools.cache
def netns_available() -> bool:
    """Probe once whether `unshare --net` works here (root, or user namespaces)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    try:
        done = subprocess.run(
            [unshare, "--net", "--", "true"], capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def isolated(argv: list[str]) -> list[str]:
    """`argv` in a new network namespace with only a loopback interface."""
    return ["unshare", "--net", "--", "sh", "-c", _LO_UP, "sh", *argv]
