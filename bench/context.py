"""What every case gets: the corral environment, a raw docker-py client on the same engine,
repetition counts, and the reset that returns the engine to a clean state between cases."""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import docker

from corral import ExecutionPlan
from corral.core.labels import OWNER
from corral.providers.docker import DockerConfig, DockerEnvironment

TEST_IMAGE = "corral.local/test:bookworm"
HOLDER_IMAGE = "corral.local/holder:bookworm"
#: Label on the baseline's own containers, so that reset removes them by label too.
RAW = "corral.bench.raw"
SETTLE_S = 1.0


@dataclass
class Context:
    env: DockerEnvironment
    raw: Any  # docker.APIClient: docker-py is untyped at this boundary
    owner: str
    scale: float
    workspace: Path
    #: where the results go: pictures a case draws land beside them
    results: Path

    def reps(self, full: int, minimum: int = 3) -> int:
        """Timed repetitions: `full` in a full run, fewer (never under `minimum`) with --quick."""
        return max(minimum, round(full * self.scale))

    def plan(self, network: str = "no-network") -> ExecutionPlan:
        return ExecutionPlan.model_validate({"image": TEST_IMAGE, "network": network})

    def leaks(self) -> list[str]:
        """Every container or network still carrying this run's owner or the raw label."""
        found: list[str] = []
        for selector in (f"{OWNER}={self.owner}", RAW):
            filters = {"label": selector}
            found += [c["Names"][0] for c in self.raw.containers(all=True, filters=filters)]
            found += [n["Name"] for n in self.raw.networks(filters=filters)]
        return found

    async def reset(self) -> list[str]:
        """Remove what this run left on the engine and let it settle; returns what went."""

        def clean() -> list[str]:
            removed: list[str] = []
            for selector in (f"{OWNER}={self.owner}", RAW):
                filters = {"label": selector}
                for c in self.raw.containers(all=True, filters=filters):
                    self.raw.remove_container(c["Id"], force=True, v=True)
                    removed.append(c["Names"][0])
                for n in self.raw.networks(filters=filters):
                    self.raw.remove_network(n["Id"])
                    removed.append(n["Name"])
            return removed

        removed = await anyio.to_thread.run_sync(clean)
        await anyio.sleep(SETTLE_S)
        return removed


def make_context(scale: float, workspace: Path, results: Path) -> Context:
    owner = f"corral-bench-{secrets.token_hex(3)}"
    config = DockerConfig(owner=owner, holder_image=HOLDER_IMAGE, pull_policy="never")
    raw = docker.APIClient()
    return Context(DockerEnvironment(config), raw, owner, scale, workspace, results)


async def timed(fn: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    await fn()
    return time.perf_counter() - started


def timed_sync(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started
