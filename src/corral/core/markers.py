"""Finding an exec's whole process tree inside a sandbox, whatever it forked or setsid'd.

Each exec runs with a unique `CORRAL_EXEC=<marker>` in its environment, which every
descendant inherits. Killing the tree means killing every process that carries it; the
kill script needs only `sh`, `tr`, `grep` and `/proc`.
"""

from __future__ import annotations

import secrets

MARKER = "CORRAL_EXEC"

KILL_TREE = (
    'm="' + MARKER + '=$1"; for d in /proc/[0-9]*; do '
    'if tr "\\000" "\\n" < "$d/environ" 2>/dev/null | grep -qx "$m"; then '
    'kill -9 "${d#/proc/}" 2>/dev/null; fi; done; true'
)


def new_marker() -> str:
    return secrets.token_hex(8)


def kill_tree_argv(marker: str, shell: tuple[str, ...] = ("sh",)) -> list[str]:
    """The kill script by `shell`: corral's own busybox shell where the sandbox has it
    (its applets, whatever the image's PATH holds), else the container's `sh`."""
    return [*shell, "-c", KILL_TREE, "sh", marker]
