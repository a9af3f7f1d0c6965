"""The full soak: 1,000 Docker opens with random cancellations and injected Engine faults.

    uv run --all-extras python -m bench.soak [--opens 1000] [--concurrency 8] [--seed 0]

Needs a Docker Engine that answers and the test images (`bash bench/run.sh --only
docker_open` starts and builds them). Prints the soak's table; exits 1 on a failure or a
leak. The CI-sized form is tests/integration/docker/test_docker_soak.py (200 opens).
"""

from __future__ import annotations

import argparse
import secrets
import sys
from typing import Any

import anyio
import docker

from bench.context import HOLDER_IMAGE, TEST_IMAGE
from corral import ExecutionPlan
from corral.core.labels import OWNER
from corral.providers.docker import DockerConfig, DockerEnvironment
from corral.testing.soak import soak


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak")
    parser.add_argument("--opens", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    owner = f"corral-soak-{secrets.token_hex(4)}"
    raw: Any = docker.APIClient()
    plan = ExecutionPlan.model_validate({"image": TEST_IMAGE, "network": "no-network"})

    def make_env(base_url: str | None) -> DockerEnvironment:
        config = {"owner": owner, "holder_image": HOLDER_IMAGE, "pull_policy": "never"}
        return DockerEnvironment(
            DockerConfig.model_validate({**config, "base_url": base_url, "api_timeout_s": 10})
        )

    def leftovers() -> list[str]:
        filters = {"label": f"{OWNER}={owner}"}
        return [c["Names"][0] for c in raw.containers(all=True, filters=filters)] + [
            n["Name"] for n in raw.networks(filters=filters)
        ]

    async def run() -> int:
        report = await soak(
            make_env,
            plan,
            leftovers,
            opens=args.opens,
            concurrency=args.concurrency,
            seed=args.seed,
        )
        print(report.table())
        return 1 if report.failures or report.leaks else 0

    return anyio.run(run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
