"""SIGTERM or SIGHUP to `corral run` ends it as Ctrl-C does: the sandbox's processes, its
cgroup or namespace and its workspace are all gone, and the exit code names the signal."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

# Left running, detached, so only corral's cleanup (not the signal) can end it.
SCRIPT = """
setsid sh -c 'while :; do echo x >> "$0"; sleep 0.05; done' "$COUNTER" </dev/null >/dev/null 2>&1 &
while [ ! -s "$COUNTER" ]; do sleep 0.05; done
echo started
sleep 600
"""


@pytest.fixture
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="corral-signals-") as path:
        (Path(path) / "root").mkdir()
        yield Path(path)


def size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_corral_run_removes_the_sandbox(scratch: Path, signum: int) -> None:
    root, counter = scratch / "root", scratch / "counter"
    command = [sys.executable, "-m", "corral", "run", "--env", "local"]
    command += ["-p", f"root_dir={root}", "--", "sh", "-c", f"COUNTER={counter}\n{SCRIPT}"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as cli:
        try:
            assert cli.stdout is not None
            assert cli.stdout.readline() == b"started\n"
            assert [p.name for p in root.iterdir()] != []  # the session's workspace
            cli.send_signal(signum)
            _, stderr = cli.communicate(timeout=30)
        finally:
            cli.kill()
    assert cli.returncode == 128 + signum, stderr.decode()
    assert f"stopped by signal {signum}".encode() in stderr
    assert list(root.iterdir()) == []
    settled = size(counter)
    time.sleep(0.5)
    assert size(counter) == settled, "a process the sandbox left is still running"
