"""A compose task with a service, run by Inspect through the `corral` sandbox: the service
is a named sandbox beside `default`, on the same localhost and under the same policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from inspect_ai.dataset import Sample
from inspect_ai.solver import Generate, Solver, TaskState, solver
from inspect_ai.util import SandboxUnavailableError, sandbox

from corral.adapters.inspect import CorralSandboxConfig, CorralSandboxEnvironment
from corral.adapters.inspect.config import load_config
from corral.compose import plan_from_compose
from tests.integration.adapters.inspect_configs import DOCKER
from tests.integration.adapters.test_inspect_lifecycle import scores_one
from tests.integration.docker.conftest import TEST_IMAGE

pytestmark = pytest.mark.docker

COMPOSE = f"""
services:
  default:
    image: {TEST_IMAGE}
    command: sleep infinity
  web:
    image: {TEST_IMAGE}
    command: ["python3", "-m", "http.server", "8080", "--bind", "127.0.0.1", "--directory", "/srv"]
    healthcheck:
      test: ["CMD", "python3", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8080/')"]
      interval: 200ms
      retries: 100
"""

FETCH = (
    "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8080/flag.txt').read().decode())"
)


@solver
def fetch_from_the_service() -> Solver:
    async def solve(state: TaskState, generate: Generate) -> TaskState:
        await sandbox("web").write_file("/srv/flag.txt", "served-by-web")
        listed = await sandbox("web").exec(["ls", "/srv"])
        fetched = await sandbox().exec(["python3", "-c", FETCH])
        # A service runs no corral helper: `exec_remote` there is Inspect's own, via exec.
        remote = await sandbox("web").exec_remote(["cat", "/srv/flag.txt"], stream=False)
        with pytest.raises(SandboxUnavailableError, match="runs no process manager"):
            await sandbox("web").as_type(CorralSandboxEnvironment).exec_remote(["true"])
        state.output.completion = (
            f"{listed.stdout.strip()} {fetched.stdout.strip()} {remote.stdout}"
        )
        return state

    return solve


def test_compose_services_are_named_sandboxes(engine: Any, owner: str, tmp_path: Path) -> None:
    path = tmp_path / "compose.yaml"
    path.write_text(COMPOSE)
    assert load_config(str(path)).plan == plan_from_compose(path)
    config = CorralSandboxConfig(
        provider="docker",
        provider_config={**DOCKER, "owner": owner},
        plan=plan_from_compose(path),
    )
    sample = Sample(input="fetch", target="flag.txt served-by-web served-by-web")
    scores_one(config, fetch_from_the_service(), sample, tmp_path)
    selector = {"label": f"corral.owner={owner}"}
    assert engine.containers.list(all=True, filters=selector) == []
