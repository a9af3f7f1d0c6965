"""Without a writable cgroup: a session's processes in a PID namespace of their own.

A user who is not root can make one inside a new user namespace (`unshare --user --pid`).
Every exec enters it (`nsenter`), and nothing started there can leave: a process's PID
namespace is fixed for its life, whatever it does (double fork, `setsid`, rename). When
the namespace's PID 1 (corral's holder) dies, the kernel kills every other process in it,
and the holder's death is reported only once they are all gone: so `kill` ends a phase's
processes atomically with respect to fork and shows, from the kernel, that none is left.

The holder also dies when the harness does: it watches a pipe whose only writer is the
harness, so a killed harness leaves no namespace behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio

from corral.errors import FeatureUnsupported, ProviderError, WorkloadNotStopped

POLL_S = 0.01
START_TIMEOUT_S = 10.0
_NS_GET_PARENT = 0xB702  # _IO(0xb7, 0x2), linux/nsfs.h

# PID 1 reaps what is orphaned into the namespace, and exits when the harness's end of
# its stdin closes (the harness died or let it go).
_HOLDER = """
import os, select
while True:
    if select.select([0], [], [], 0.5)[0] and not os.read(0, 1):
        raise SystemExit(0)
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
"""


@functools.cache
def pidns_available() -> bool:
    """Probe once whether this user may make a user + PID namespace here."""
    unshare = shutil.which("unshare")
    if unshare is None or shutil.which("nsenter") is None:
        return False
    try:
        done = subprocess.run(
            [unshare, "--user", "--map-current-user", "--pid", "--fork", "--", "true"],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


class SessionPidNamespace:
    """One session's PID namespace; `kill` ends everything in it and makes a fresh one."""

    def __init__(self, unshare: subprocess.Popen[bytes], holder: int) -> None:
        self._hold(unshare, holder)

    def _hold(self, unshare: subprocess.Popen[bytes], holder: int) -> None:
        self._unshare = unshare
        self.holder = holder
        self._ns = Path(f"/proc/{holder}/ns/pid").readlink()
        self._ino = Path(f"/proc/{holder}/ns/pid").stat().st_ino

    @classmethod
    def start(cls) -> SessionPidNamespace:
        """Start a holder, or raise `FeatureUnsupported` saying what the host lacks."""
        return cls(*_spawn())

    def enter(self, argv: list[str]) -> list[str]:
        """`argv` run inside the namespace, with this user's own uid and gid."""
        return [
            "nsenter",
            f"--target={self.holder}",
            "--user",
            "--pid",
            "--preserve-credentials",
            "--",
            *argv,
        ]

    def alive(self) -> list[int]:
        """The host pids of every live process in the namespace but its holder, counting
        those in namespaces nested in it (a workload may make its own)."""
        found: list[int] = []
        host = Path("/proc/self/ns/pid").readlink()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == self.holder:
                continue
            with contextlib.suppress(OSError):
                ns = (entry / "ns" / "pid").readlink()
                if ns == host or (ns != self._ns and not self._holds(entry / "ns" / "pid")):
                    continue
                stat = (entry / "stat").read_text()
                if stat[stat.rindex(")") + 2] not in "ZX":
                    found.append(int(entry.name))
        return found

    def _holds(self, ns: Path) -> bool:
        """Whether the PID namespace `ns` is this one or nested in it, by the kernel's
        own parent links (a name or a pid the workload chose proves nothing)."""
        fd = os.open(ns, os.O_RDONLY)
        try:
            while os.fstat(fd).st_ino != self._ino:
                try:
                    parent = fcntl.ioctl(fd, _NS_GET_PARENT)
                except OSError:  # above the namespaces this user owns: not ours
                    return False
                os.close(fd)
                fd = parent
            return True
        finally:
            os.close(fd)

    async def kill(self, timeout_s: float) -> None:
        """End every process of the namespace, then hold a fresh one in its place."""
        await self.remove(timeout_s)
        with anyio.CancelScope(shield=True):  # a dropped result would leak the holder
            self._hold(*await anyio.to_thread.run_sync(_spawn))

    async def remove(self, timeout_s: float) -> None:
        # The holder is unshare's child: unshare exits only once it has reaped the
        # holder, which the kernel lets die only after the rest of the namespace.
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.holder, signal.SIGKILL)
        deadline = time.monotonic() + timeout_s
        while self._unshare.poll() is None:
            if time.monotonic() > deadline:
                raise WorkloadNotStopped(
                    f"processes {', '.join(map(str, self.alive()))} of the session's PID "
                    f"namespace were still alive {timeout_s:.0f} s after its PID 1 was killed"
                )
            await anyio.sleep(POLL_S)
        _stop(self._unshare)


def _spawn() -> tuple[subprocess.Popen[bytes], int]:
    """A new holder: its `unshare` and the holder's host pid."""
    if not pidns_available():
        raise FeatureUnsupported(
            "this host lets corral make neither a session cgroup (root, cgroup v2) nor "
            "a user + PID namespace (`unshare --user --pid`; enable unprivileged user "
            "namespaces: sysctl user.max_user_namespaces > 0, and on Debian/Ubuntu "
            "kernel.unprivileged_userns_clone=1 or no AppArmor userns restriction)"
        )
    unshare = subprocess.Popen(
        [
            "unshare",
            "--user",
            "--map-current-user",
            "--pid",
            "--fork",
            "--kill-child",
            "--",
            sys.executable,
            "-I",
            "-c",
            _HOLDER,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    children = Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children")
    while True:
        with contextlib.suppress(OSError):
            pids = children.read_text().split()
            if pids:
                return unshare, int(pids[0])
        if unshare.poll() is not None or time.monotonic() > deadline:
            _stop(unshare)
            raise ProviderError(
                f"the session's PID namespace holder did not start (unshare exited "
                f"{unshare.returncode})"
            )
        time.sleep(POLL_S)


def _stop(unshare: subprocess.Popen[bytes]) -> None:
    if unshare.stdin is not None:
        unshare.stdin.close()
    with contextlib.suppress(ProcessLookupError):
        unshare.kill()
    unshare.wait()
