"""Background processes on `local`: corral's process manager as a child of the harness.

The manager (`corral-exec --procs-stdio`) runs outside the session's cgroup and PID
namespace; each process it starts goes where the session's execs go: straight into the
cgroup (`CLONE_INTO_CGROUP`), or into the PID namespace (`nsenter`), and into a fresh
network namespace under `no-network`. So `end_workload` ends them with everything else,
the manager reports their deaths, and a policy switch sees them alive. When the harness
goes (its end of the manager's stdin closes), the manager kills what it holds and exits.
"""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path

import anyio.to_thread
from anyio.lowlevel import EventLoopToken

from corral.errors import FeatureUnsupported, ProviderError
from corral.helper import helper_binary, no_helper
from corral.helper.link import DIAGNOSTICS, ChannelUnavailable, greeted
from corral.helper.procs import ProcessLink

#: seconds the manager gets to kill what it holds and exit once its stdin closes
EXIT_WAIT_S = 5.0


def manager_binary() -> Path:
    binary = helper_binary(platform.machine())
    if binary is None:
        raise FeatureUnsupported(
            f"background processes on local need corral's helper: {no_helper(platform.machine())}"
        )
    return binary


class PipeTransport:
    """The manager's stdin and stdout; its stderr kept, bounded, for the diagnostics."""

    def __init__(self, child: subprocess.Popen[bytes]) -> None:
        assert child.stdin is not None and child.stdout is not None and child.stderr is not None
        self.child = child
        self._in, self._out, self._err = child.stdin, child.stdout, child.stderr
        self._write_lock = threading.Lock()

    def recv(self) -> bytes:
        return os.read(self._out.fileno(), 65536)

    def send(self, data: bytes) -> None:
        with self._write_lock:
            self._in.write(data)
            self._in.flush()

    def shutdown(self) -> None:
        # Its stdin closed, the manager kills what it holds and exits: stdout ends too.
        with contextlib.suppress(OSError, ValueError), self._write_lock:
            self._in.close()

    def close(self) -> None:
        self.shutdown()
        try:
            self.child.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()
        self._out.close()

    def diagnostics(self) -> str:
        if self.child.poll() is None:
            return ""
        return self._err.read(DIAGNOSTICS).decode(errors="replace").strip()


def start_manager(
    token: EventLoopToken, *, env: Mapping[str, str], cgroup: Path | None, sandbox_id: str
) -> ProcessLink:
    """A manager for one session (blocking: run it in a worker thread). Its own
    environment is the session's, which a process started as itself inherits."""
    try:
        child = subprocess.Popen(
            [str(manager_binary()), "--procs-stdio", str(cgroup or "")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            cwd="/",
            start_new_session=True,
        )
    except OSError as exc:
        raise ProviderError(f"cannot start corral's process manager: {exc}") from None
    return ProcessLink(PipeTransport(child), token, "local", 4, sandbox_id)


async def connect(
    token: EventLoopToken, *, env: Mapping[str, str], cgroup: Path | None, sandbox_id: str
) -> ProcessLink:
    link = await anyio.to_thread.run_sync(
        lambda: start_manager(token, env=env, cgroup=cgroup, sandbox_id=sandbox_id)
    )
    try:
        return await greeted(link)
    except ChannelUnavailable as exc:
        raise ProviderError(f"corral's process manager did not start: {exc}") from None
