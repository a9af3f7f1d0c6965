"""What an operation may leave on the host, seen from the host: threads still at work,
corral's temporary files, and processes that carry a tag in their environment."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import TypeVar

import anyio

T = TypeVar("T", bound=Collection[object])

#: Name prefixes of corral's temporary files and directories (workspaces, staging trees,
#: partial downloads).
TEMP_PREFIXES = ("corral-", ".corral-")
SETTLE_S = 5.0


async def settled(look: Callable[[], T], timeout: float = SETTLE_S) -> T:
    """`look()` again until it finds nothing or `timeout` passes; what it found last."""
    deadline = time.monotonic() + timeout
    found = look()
    # Nothing notifies when a thread ends or a process is reaped: the host is polled.
    while found and time.monotonic() < deadline:
        await anyio.sleep(0.05)
        found = look()
    return found


def _idle_worker(thread: threading.Thread) -> bool:
    # anyio's worker threads put themselves back on their pool's idle deque between jobs.
    idle: Iterable[threading.Thread] = getattr(thread, "idle_workers", ())
    return thread in idle


async def busy_threads(
    before: set[threading.Thread],
    timeout: float = SETTLE_S,
    *,
    live_sessions: frozenset[str] = frozenset(),
) -> list[str]:
    """Threads started since `before` that are alive and not idle pool workers, once they
    were given `timeout` seconds to finish. A thread a session keeps for its whole life
    (the Docker exec channel's reader) ends its name with the session's id; it is not
    counted while that session is in `live_sessions`, and must be gone once it closes."""
    return await settled(
        lambda: [
            t.name
            for t in threading.enumerate()
            if t not in before
            and t.is_alive()
            and not _idle_worker(t)
            and not any(t.name.endswith(f"-{sid}") for sid in live_sessions)
        ],
        timeout,
    )


def temp_entries(*directories: Path) -> set[Path]:
    """corral's temporary entries directly in `directories`."""
    found: set[Path] = set()
    for directory in directories:
        if directory.is_dir():
            found |= {p for p in directory.iterdir() if p.name.startswith(TEMP_PREFIXES)}
    return found


def tagged_processes(tag: str) -> list[int]:
    """Pids on this host whose environment holds `tag` (this host's pid namespace)."""
    needle = tag.encode()
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone meanwhile, or a kernel thread
        if needle in environ:
            found.append(int(entry.name))
    return found
