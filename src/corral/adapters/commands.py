"""Command lines the adapters hand a session for the harnesses they serve."""

from __future__ import annotations

from collections.abc import Sequence

#: how a command's stderr joins its stdout: the workload's own shell, `exec`ing it
_MERGED = ("/bin/sh", "-c", 'exec 2>&1; exec "$@"', "sh")


def merged(args: Sequence[str]) -> list[str]:
    """`args` run with stderr on stdout's pipe: one stream, in the order it was written
    (what `subprocess`'s `stderr=STDOUT` gives)."""
    return [*_MERGED, *args]
