"""A cgroup v2 per `local` session: every exec joins it, so a phase's processes can be ended.

A process stays in its cgroup whatever it does (double fork, `setsid`, rename, setuid):
only a write to another cgroup's `cgroup.procs` moves it, which needs write access to that
cgroup, i.e. root on the host. So for a workload that is not root on the host, writing
`1` to `cgroup.kill` (Linux 5.14) kills every process corral started for the session,
atomically with respect to fork, and `cgroup.events` (`populated 0`) shows, from the
kernel, that none is left. A workload running as host root can move itself out: the
local provider is not a security boundary.

The cgroup is made beside corral's own (in the cgroup v2 hierarchy: the whole tree on a
unified host, `/sys/fs/cgroup/unified` on a hybrid one); where that is not writable
(corral is not root, no cgroup v2, an older kernel), `create` says why.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

import anyio

from corral.errors import FeatureUnsupported, ProviderError, WorkloadNotStopped

POLL_S = 0.01


def _hierarchy() -> Path:
    """Where corral's own cgroup v2 is, as this process sees it."""
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    roots = [
        (fields[3], fields[4])
        for fields in (line.split() for line in mounts)
        if fields[fields.index("-") + 1] == "cgroup2"
    ]
    own = [
        path
        for hierarchy, controllers, path in (
            line.split(":", 2) for line in Path("/proc/self/cgroup").read_text().splitlines()
        )
        if hierarchy == "0" and not controllers
    ]
    if not roots or not own:
        raise FeatureUnsupported("this host has no cgroup v2 hierarchy mounted")
    mount_root, mount_point = roots[0]
    relative = os.path.relpath(own[0], mount_root)
    if relative.startswith(".."):
        raise FeatureUnsupported(f"corral's cgroup {own[0]!r} is outside the mounted hierarchy")
    return Path(mount_point, relative)


@functools.cache
def cgroup_available() -> bool:
    """Probe once whether corral may make session cgroups here."""
    try:
        SessionCgroup.create(f"corral-probe-{os.getpid()}").path.rmdir()
    except (FeatureUnsupported, OSError):
        return False
    return True


class SessionCgroup:
    """One session's cgroup; `kill` empties it, `remove` empties and deletes it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, name: str) -> SessionCgroup:
        """Make the cgroup, or raise `FeatureUnsupported` saying why it cannot be made."""
        path = _hierarchy() / name
        try:
            path.mkdir()
        except OSError as exc:
            raise FeatureUnsupported(
                f"cannot create the session cgroup {str(path)!r} ({exc.strerror}); ending a "
                "phase's processes on the local provider needs a writable cgroup v2 (root)"
            ) from None
        if not (path / "cgroup.kill").exists():
            path.rmdir()
            raise FeatureUnsupported("this kernel has no cgroup.kill (Linux 5.14 or newer)")
        return cls(path)

    def join(self, pid: int) -> None:
        """Move a process (not yet running the workload) into the cgroup."""
        try:
            (self.path / "cgroup.procs").write_text(str(pid))
        except OSError as exc:
            raise ProviderError(
                f"cannot move pid {pid} into the session cgroup {str(self.path)!r}: {exc}"
            ) from None

    def populated(self) -> bool:
        events = (self.path / "cgroup.events").read_text().split()
        return events[events.index("populated") + 1] != "0"

    def alive(self) -> list[int]:
        """The pids in the cgroup and every cgroup under it (a root workload may make one
        and move into it); a process that has exited is gone from them."""
        return [
            int(pid)
            for procs in sorted(self.path.rglob("cgroup.procs"))
            for pid in procs.read_text().split()
        ]

    async def kill(self, timeout_s: float) -> None:
        """Kill every process in the cgroup, then wait until the kernel shows it empty."""
        (self.path / "cgroup.kill").write_text("1")
        deadline = time.monotonic() + timeout_s
        while self.populated():
            if time.monotonic() > deadline:
                pids = ", ".join(map(str, self.alive()))
                raise WorkloadNotStopped(
                    f"processes {pids} of cgroup {str(self.path)!r} were still "
                    f"alive {timeout_s:.0f} s after cgroup.kill"
                )
            await anyio.sleep(POLL_S)

    async def remove(self, timeout_s: float) -> None:
        await self.kill(timeout_s)
        # Cgroups a workload made under the session's (emptied by the kill) go first,
        # deepest first: a cgroup with children cannot be removed.
        made = [p for p in self.path.rglob("*") if p.is_dir() and not p.is_symlink()]
        try:
            for child in sorted(made, key=lambda p: len(p.parts), reverse=True):
                child.rmdir()
            self.path.rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise ProviderError(f"cannot remove cgroup {str(self.path)!r}: {exc}") from None
