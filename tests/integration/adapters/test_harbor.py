"""corral's `docker` provider behind Harbor: Harbor's own `harbor run`, on local tasks.

`harbor_tasks/` holds three tasks (see its README): one whose agent must reach an allowed
host, one whose agent and verifier must not reach a forbidden one, and a compose task with
a web service beside the sandbox. The oracle agent must score 1 on each and the no-op
agent 0; nothing corral created may be left. Harbor needs
Python >= 3.12: in the project's 3.11 environment this module skips with that reason, and
`tests/run.sh` runs it again in its Python 3.12 stage (`.venv-3.12`, every extra).
"""

from __future__ import annotations

import importlib
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

hb_task: Any = importlib.import_module("harbor.models.task.config")
hb_paths: Any = importlib.import_module("harbor.models.trial.paths")

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
    results = harbor_run(owner, TASKS, agent, tmp_path, n_tasks=3)
    for name in ("allowed-host", "forbidden-host", "two-services"):
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


def environment(owner: str, tmp_path: Path, policy: Any = None, **extra: Any) -> Any:
    """A CorralEnvironment built as Harbor's trial builds one, without a trial."""
    from corral.adapters.harbor import CorralEnvironment

    trial_paths = hb_paths.TrialPaths(tmp_path / "trial")
    trial_paths.mkdir()
    env_dir = tmp_path / "environment"
    env_dir.mkdir(exist_ok=True)
    return CorralEnvironment(
        environment_dir=env_dir,
        environment_name="semantics",
        session_id="semantics__env",
        trial_paths=trial_paths,
        task_env_config=hb_task.EnvironmentConfig(docker_image=TEST_IMAGE, workdir="/app"),
        network_policy=policy,
        provider="docker",
        provider_config=env_config(owner),
        **extra,
    )


@pytest.mark.anyio
async def test_exec_and_files_follow_harbor(engine: Any, owner: str, tmp_path: Path) -> None:
    env = environment(owner, tmp_path)
    await env.start(force_build=False)
    try:
        shell = await env.exec(
            'echo "$BASH_VERSION" | cut -c1; pwd; echo "$FLAG"', env={"FLAG": "on"}
        )
        assert (shell.return_code, shell.stdout) == (0, "5\n/app\non\n")
        failed = await env.exec("echo oops >&2; exit 3", cwd="/tmp")
        assert (failed.return_code, failed.stdout, failed.stderr) == (3, None, "oops\n")
        with pytest.raises(RuntimeError, match="timed out after 1 seconds"):
            await env.exec("sleep 30", timeout_sec=1)
        as_root = await env.exec("id -u", user="root")
        assert as_root.stdout == "0\n"

        # upload_dir merges into the target, as `docker cp src/. main:dst` does.
        first, second = tmp_path / "first", tmp_path / "second"
        (first / "sub").mkdir(parents=True)
        (first / "sub" / "a.txt").write_text("a")
        (second / "sub").mkdir(parents=True)
        (second / "sub" / "b.txt").write_text("b")
        await env.upload_dir(first, "/app/data")
        await env.upload_dir(second, "/app/data")
        listed = await env.exec("find data -type f | sort")
        assert listed.stdout == "data/sub/a.txt\ndata/sub/b.txt\n"

        # download_dir lands the tree's contents in the target, overwriting what is there.
        back = tmp_path / "back"
        (back / "sub").mkdir(parents=True)
        (back / "sub" / "a.txt").write_text("stale")
        await env.download_dir("/app/data", back)
        assert (back / "sub" / "a.txt").read_text() == "a"
        assert (back / "sub" / "b.txt").read_text() == "b"
        await env.upload_file(first / "sub" / "a.txt", "/app/one.txt")
        await env.download_file("/app/one.txt", tmp_path / "one.txt")
        assert (tmp_path / "one.txt").read_text() == "a"
        assert await env.is_dir("/app/data") and not await env.is_file("/app/data")
        assert leftovers(engine, owner)
    finally:
        await env.stop(delete=True)
    assert leftovers(engine, owner) == []
    await env.stop(delete=True)  # idempotent


def test_a_wildcard_allowlist_is_accepted_on_docker(owner: str, tmp_path: Path) -> None:
    # corral's docker provider enforces wildcards through its resolver in the holder
    # (tests/integration/docker/test_docker_wildcard.py), so Harbor lets the task through.
    wildcard = hb_task.NetworkPolicy(network_mode="allowlist", allowed_hosts=["*.example.com"])
    assert environment(owner, tmp_path, wildcard) is not None


SIDECAR = f"""
services:
  main:
    build: .
  web:
    image: {TEST_IMAGE}
    command: ["sleep", "infinity"]
"""


@pytest.mark.anyio
async def test_service_calls_reach_a_compose_service(
    engine: Any, owner: str, tmp_path: Path
) -> None:
    (tmp_path / "environment").mkdir()
    (tmp_path / "environment" / "docker-compose.yaml").write_text(SIDECAR)
    env = environment(owner, tmp_path)
    assert env.capabilities.docker_compose
    await env.start(force_build=False)
    try:
        wrote = await env.service_exec("echo from-web > /tmp/mark; hostname", service="web")
        assert wrote.return_code == 0, wrote.stderr
        main = await env.service_exec("cat /tmp/mark 2>&1 || true", service="main")
        assert "from-web" not in (main.stdout or "")
        await env.service_download_file("/tmp/mark", tmp_path / "mark", service="web")
        assert (tmp_path / "mark").read_text() == "from-web\n"
        await env.exec("setsid nohup sleep 1000 >/dev/null 2>&1 &")
        await env.stop_service("main")  # the agent's processes end; the sandbox stays
        left = await env.exec("ps -eo args | grep -c '[s]leep 1000' || true")
        assert (left.stdout or "").strip() == "0"
        still = await env.service_exec("cat /tmp/mark", service="web")
        assert still.stdout == "from-web\n", "the service kept running"
    finally:
        await env.stop(delete=True)
    assert leftovers(engine, owner) == []


def test_compose_overlays_are_refused(owner: str, tmp_path: Path) -> None:
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(SIDECAR)
    with pytest.raises(ValueError, match="extra-docker-compose.*overlay.yaml"):
        environment(owner, tmp_path, extra_docker_compose=[overlay])


@pytest.mark.anyio
async def test_an_agents_key_is_withheld_and_its_base_url_routed(
    engine: Any, owner: str, tmp_path: Path
) -> None:
    """The key Harbor would hand the agent never reaches the sandbox; its base URL is the
    route's, served by corral's proxy (which would add the real key upstream)."""
    route = {"upstream": "https://api.example.com/v1", "headers": {"X-Api-Key": "sk-real-key"}}
    env = environment(
        owner,
        tmp_path,
        credentials={"model": route},
        credential_env={"OPENAI_BASE_URL": "model"},
        withhold_env=["OPENAI_API_KEY"],
    )
    await env.start(force_build=False)
    try:
        seen = await env.exec(
            'echo "$OPENAI_API_KEY"; echo "$OPENAI_BASE_URL"; env | grep -c sk-real-key || true',
            env={"OPENAI_API_KEY": "sk-real-key", "OPENAI_BASE_URL": "https://elsewhere"},
        )
    finally:
        await env.stop(delete=True)
    key, url, count = (seen.stdout or "").split()
    assert key == "corral-credential-route" and count == "0", seen
    assert url.startswith("http://") and url.endswith("/model"), url
    assert leftovers(engine, owner) == []
