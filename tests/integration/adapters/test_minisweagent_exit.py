"""mini-swe-agent never calls its environment's `cleanup()` (its `mini` command leaves it
to `__del__`): a process that opens a corral environment, runs a command and exits
without it still exits promptly, and leaves no sandbox behind, on `local` and Docker."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.integration.adapters.inspect_configs import DOCKER
from tests.integration.docker.conftest import TEST_IMAGE, leftovers

ROOT = Path(__file__).parents[3]

# What `mini` does with its environment: built by mini-swe-agent from a config, used,
# dropped at exit; a loop detached into the sandbox is left running too.
HARNESS = r"""
import json, sys
from minisweagent.environments import get_environment

environment = get_environment(json.loads(sys.argv[1]))
said = environment.execute(
    {"command": "setsid sh -c 'sleep 613' </dev/null >/dev/null 2>&1 & echo ran"}
)
print(said["output"].strip(), environment.session.id, flush=True)
"""

#: seconds the process may take, Python's and mini-swe-agent's imports included
WITHIN = 25.0


def run_harness(config: dict[str, Any]) -> str:
    """The last line the harness printed, once it exited within `WITHIN` seconds."""
    config = {"environment_class": "corral.adapters.minisweagent.CorralEnvironment", **config}
    try:
        done = subprocess.run(
            [sys.executable, "-c", HARNESS, json.dumps(config)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=WITHIN,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the harness did not exit within {WITHIN} s of its start")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]  # mini-swe-agent prints a banner first


def test_a_harness_that_never_cleans_up_exits_and_leaves_nothing_on_local() -> None:
    # Not under pytest's tmp_path: the sandbox's user must be able to search root_dir's path.
    with tempfile.TemporaryDirectory(prefix="corral-mini-") as scratch:
        Path(scratch).chmod(0o711)
        root, sessions = Path(scratch) / "root", Path(scratch) / "sessions"
        root.mkdir()
        sessions.mkdir()
        said = _run_on_local(root, sessions)
        assert list(root.iterdir()) == [], "the session's workspace stays"
        assert list(sessions.iterdir()) == [], "the session's record stays"
    session_id = said.split()[1]
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True)
    assert "sleep 613" not in ps.stdout, f"session {session_id} left its loop running"


def _run_on_local(root: Path, sessions: Path) -> str:
    provider_config = {"root_dir": str(root), "session_dir": str(sessions)}
    said = run_harness({"provider": "local", "provider_config": provider_config})
    assert said.startswith("ran ")
    return said


@pytest.mark.docker
def test_a_harness_that_never_cleans_up_exits_and_leaves_nothing_on_docker(
    engine: Any, owner: str
) -> None:
    said = run_harness(
        {
            "provider": "docker",
            "provider_config": {**DOCKER, "owner": owner},
            "plan": {"image": TEST_IMAGE},
        }
    )
    assert said.startswith("ran ")
    assert leftovers(engine, owner) == []
