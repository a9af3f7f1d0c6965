"""`corral-docker` through the real AgentCompass package, on a real Docker Engine.

AgentCompass needs Python >= 3.12; in the project's 3.11 environment this module skips
with that reason, and `tests/run.sh` runs it again in its Python 3.12 stage (`.venv-3.12`,
the same lock file with every extra).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

from corral.adapters.agentcompass.contract import load
from tests.integration.docker.conftest import HOLDER_IMAGE, TEST_IMAGE
from tests.readme import Block, docker_leftovers, run_block, runnable

pytest.importorskip(
    "agentcompass",
    reason="AgentCompass needs Python >= 3.12; tests/run.sh runs this in its 3.12 stage",
)

pytestmark = [pytest.mark.anyio, pytest.mark.docker]


def _request(owner: str) -> tuple[Any, Any]:
    models: Any = importlib.import_module("agentcompass.runtime.models")
    spec = models.EnvironmentSpec(
        id="corral-docker",
        params={
            "provider_config": {
                "owner": owner,
                "holder_image": HOLDER_IMAGE,
                "pull_policy": "never",
            }
        },
        setup={"image": TEST_IMAGE, "workdir": "/tmp/work"},
        baseline_network_policy="public",
        env_variables={"TASK_FLAG": "on"},
    )
    request = models.RunRequest(
        benchmark=models.BenchmarkSpec(id="corral-check"),
        harness=models.HarnessSpec(id="none"),
        environment=spec,
        model=models.ModelSpec(id="none"),
    )
    plan = models.ExecutionPlan(
        environment=spec,
        run_network_policy={"network_mode": "no-network"},
        evaluation_network_policy="public",
        task_id="t1",
    )
    return request, plan


async def test_open_exec_files_policy_close(engine: Any, owner: str) -> None:
    import corral.adapters.agentcompass as adapter

    assert "corral-docker" in adapter.REGISTERED, adapter.UNAVAILABLE
    ac = load()
    env = ac.ENVIRONMENTS.create("corral-docker")
    request, plan = _request(owner)
    session = await env.open(request, plan)
    selector = {"label": f"corral.session={session.inner.id}"}
    try:
        listed = await session.exec(["sh", "-c", "pwd; echo $TASK_FLAG"])
        assert (listed.returncode, listed.stdout) == (0, "/tmp/work\non\n")
        piped = await session.exec("echo a | tr a b", shell=True)
        assert piped.stdout == "b\n"
        slow = await session.exec(["sleep", "5"], timeout=1)
        assert slow.timed_out and slow.returncode == 124
        await session.write_text("notes/out.txt", "hello")
        assert await session.read_text("/tmp/work/notes/out.txt") == "hello"
        with pytest.raises(FileNotFoundError):
            await session.read_text("missing.txt")
        await session.set_network_policy(ac.NetworkPolicy.from_value("no-network"))
        assert session.inner.policy.network_mode.value == "no-network"
        assert engine.containers.list(filters=selector)
    finally:
        assert await session.close()
    assert not engine.containers.list(all=True, filters=selector)


DOCS = runnable("agentcompass")


@pytest.mark.parametrize("block", DOCS, ids=[b.where for b in DOCS])
def test_the_docs_block_runs_through_agentcompass(
    block: Block, engine: Any, tmp_path: Path
) -> None:
    run_block(block, tmp_path)
    assert docker_leftovers(engine, "corral") == []
