"""`corral gc --env local` removes what a killed harness left (its session's processes,
cgroup and workspace), and nothing of a harness still alive or of a record it did not
write."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.integration.conftest import unavailable

# A harness: one session, a detached loop left in it, then it waits to be killed.
HARNESS = r"""
import sys, anyio
from corral import ExecutionPlan
from corral.providers.local import LocalEnvironment

# It has counted once before the exec returns: the exec's end kills its process group,
# which the loop may not have left by then.
LOOP = (
    "setsid sh -c 'while :; do echo x >> \"$0\"; sleep 0.05; done' \"$C\" "
    "</dev/null >/dev/null 2>&1 & while [ ! -s \"$C\" ]; do sleep 0.05; done"
)

async def main() -> None:
    env = LocalEnvironment(root_dir=sys.argv[1], session_dir=sys.argv[2])
    session = await env.open(ExecutionPlan())
    assert (await session.exec(LOOP, env={"C": sys.argv[3]})).ok
    print(session.id, flush=True)
    await anyio.sleep(600)

anyio.run(main)
"""


@pytest.fixture
def scratch() -> Iterator[Path]:
    if os.geteuid() != 0:
        unavailable("what a killed harness leaves running is kept in a cgroup: needs root")
    with tempfile.TemporaryDirectory(prefix="corral-gc-") as path:
        for name in ("root", "sessions", "victim"):
            (Path(path) / name).mkdir()
        (Path(path) / "victim" / "keep.txt").write_text("mine\n")
        yield Path(path)


def harness(scratch: Path, counter: str) -> tuple[subprocess.Popen[bytes], str]:
    args = [str(scratch / "root"), str(scratch / "sessions"), str(scratch / counter)]
    proc = subprocess.Popen([sys.executable, "-c", HARNESS, *args], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().decode().strip()


def growing(counter: Path) -> bool:
    before = counter.stat().st_size
    time.sleep(0.3)
    return counter.stat().st_size > before


def gc(scratch: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "corral", "gc", "--env", "local"]
    command += ["-p", f"session_dir={scratch / 'sessions'}"]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_gc_removes_what_a_killed_harness_left_and_nothing_else(scratch: Path) -> None:
    dead, dead_id = harness(scratch, "dead")
    live, live_id = harness(scratch, "live")
    try:
        # A record the harness did not write: its "workspace" is a directory of the user's.
        forged = {
            "id": "forgedforged",
            "owner": "corral",
            "workspace": str(scratch / "victim"),
            "cgroup": None,
            "harness_pid": dead.pid,
            "harness_started": 1,
            "created_at": datetime.now(UTC).isoformat(),
        }
        forged_path = scratch / "sessions" / "corral-session-forgedforged.json"
        forged_path.write_text(json.dumps(forged))
        dead.send_signal(signal.SIGKILL)
        dead.wait()
        # What the kill left: the session's loop runs on, its workspace stays.
        assert growing(scratch / "dead")
        workspaces = sorted(p.name.split("-")[1] for p in (scratch / "root").iterdir())
        assert workspaces == sorted([dead_id, live_id])

        done = gc(scratch)
        assert done.returncode == 0, done.stderr
        assert f"session {dead_id}" in done.stdout
        assert live_id not in done.stdout
        assert not growing(scratch / "dead")
        assert [p.name.split("-")[1] for p in (scratch / "root").iterdir()] == [live_id]
        assert (scratch / "victim" / "keep.txt").read_text() == "mine\n"
        assert "session record forgedforged" in done.stdout
        assert not forged_path.exists()
        # The live harness's session is whole: its loop runs, its record stays.
        assert growing(scratch / "live")
        assert (scratch / "sessions" / f"corral-session-{live_id}.json").exists()
        again = gc(scratch)
        assert "0 expired resource(s) removed" in again.stdout, again.stdout
    finally:
        for proc in (dead, live):
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    # SIGTERM ended the other harness outright (it set no handler): gc takes its session.
    assert f"session {live_id}" in gc(scratch).stdout
    assert list((scratch / "root").iterdir()) == []
    assert not growing(scratch / "live")
