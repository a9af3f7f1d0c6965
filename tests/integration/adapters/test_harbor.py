"""corral's `docker` provider behind Harbor: Harbor's own `harbor run`, on local tasks.

`harbor_tasks/` holds two tasks (see its README): one whose agent must reach an allowed
host, one whose agent and verifier must not reach a forbidden one. The oracle agent must
score 1 on both and the no-op agent 0; nothing corral created may be left. Harbor needs
Python >= 3.12: in the project's 3.11 environment this module skips with that reason, and
`tests/run.sh` runs it again in its Python 3.12 stage (`.venv-3.12`, every extra).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from corral.testing.plugin import EgressTarget
from tests.integration.docker.conftest import TEST_IMAGE, env_config, leftovers

pytest.importorskip(
    "harbor", reason="Harbor needs Python >= 3.12; tests/run.sh runs this in its 3.12 stage"
)

pytestmark = pytest.mark.docker

TASKS = Path(__file__).parent / "harbor_tasks"
IMPORT_PATH = "corral.adapters.harbor:CorralEnvironment"
HARBOR = Path(sys.executable).parent / "harbor"


def harbor_run(
    owner: str, tasks: Path, agent: str, jobs: Path, *, n_tasks: int
) -> dict[str, dict[str, Any]]:
    """`harbor run` on `tasks` (one task or a directory of them); results by task name."""
    args = [
        str(HARBOR),
        "run",
        "--path",
        str(tasks),
        "--agent",
        agent,
        "--env",
        IMPORT_PATH,
        "--ek",
        "provider=docker",
        "--ek",
        f"provider_config={json.dumps(env_config(owner))}",
        "--jobs-dir",
        str(jobs),
        "--job-name",
        agent,
        "--n-concurrent",
        "2",
        "--yes",
        "--quiet",
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False)
    results: dict[str, dict[str, Any]] = {}
    for path in (jobs / agent).glob("*/result.json"):
        result = json.loads(path.read_text())
        results[result["task_name"].rpartition("/")[2]] = result
    assert len(results) == n_tasks, f"harbor run: {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return results


def reward(result: dict[str, Any]) -> float | None:
    verifier: dict[str, Any] = result.get("verifier_result") or {}
    rewards: dict[str, float] = verifier.get("rewards") or {}
    return rewards.get("reward")


def explain(result: dict[str, Any]) -> str:
    """What the trial left for a failure message: its error, the verifier's output."""
    trial_dir = Path(result["trial_uri"].removeprefix("file://"))
    output = trial_dir / "verifier" / "test-stdout.txt"
    tests = output.read_text() if output.exists() else "(no verifier output)"
    return f"{result.get('exception_info')}\nverifier: {tests}"


@pytest.mark.parametrize(("agent", "expected"), [("oracle", 1.0), ("nop", 0.0)])
def test_harbor_run_scores(
    engine: Any,
    owner: str,
    tcp_targets: list[EgressTarget],
    tmp_path: Path,
    agent: str,
    expected: float,
) -> None:
    results = harbor_run(owner, TASKS, agent, tmp_path, n_tasks=2)
    for name in ("allowed-host", "forbidden-host"):
        result = results[name]
        assert result["exception_info"] is None, explain(result)
        assert reward(result) == expected, f"{name}: {explain(result)}"
    assert leftovers(engine, owner) == []


def test_failed_start_leaves_nothing(
    engine: Any, owner: str, tcp_targets: list[EgressTarget], tmp_path: Path
) -> None:
    task = tmp_path / "tasks" / "allowed-host"
    shutil.copytree(TASKS / "allowed-host", task)
    config = task / "task.toml"
    config.write_text(config.read_text().replace(TEST_IMAGE, "corral.local/missing:none"))
    result = harbor_run(owner, task, "oracle", tmp_path / "jobs", n_tasks=1)["allowed-host"]
    assert reward(result) is None
    assert "corral.local/missing:none" in result["exception_info"]["exception_message"]
    assert leftovers(engine, owner) == []
