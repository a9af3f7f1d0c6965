"""corral beside AgentCompass's own Docker provider, both driven through AgentCompass's
environment interface on the same engine: open, exec `true`, and a switch to no-network
and back.

AgentCompass needs Python >= 3.12: `bash bench/run.sh` runs the bench in the 3.12
environment (`.venv-3.12`, the same lock file), where these rows are measured. Elsewhere
the row says why it is missing.
"""

from __future__ import annotations

import importlib
import io
import time
from importlib.util import find_spec
from typing import Any

from bench.context import HOLDER_IMAGE, TEST_IMAGE, Context
from bench.report import Row
from bench.stats import summarize

REASON = "skipped: AgentCompass needs Python >= 3.12; `bash bench/run.sh` runs the bench on 3.12"


PROXY_IMAGE = "corral.local/agentcompass-proxy:bench"


def _proxy_image(ctx: Context) -> str:
    """AgentCompass's egress proxy runs `python`; the test image has `python3` only."""
    if not ctx.raw.images(name=PROXY_IMAGE):
        dockerfile = f"FROM {TEST_IMAGE}\nRUN ln -s /usr/bin/python3 /usr/local/bin/python\n"
        for _ in ctx.raw.build(fileobj=io.BytesIO(dockerfile.encode()), tag=PROXY_IMAGE, rm=True):
            pass
    return PROXY_IMAGE


def _request(ctx: Context, env_id: str) -> tuple[Any, Any]:
    models: Any = importlib.import_module("agentcompass.runtime.models")
    params: dict[str, Any] = (
        {
            "provider_config": {
                "owner": ctx.owner,
                "holder_image": HOLDER_IMAGE,
                "pull_policy": "never",
            }
        }
        if env_id == "corral-docker"
        else {"allowlist_proxy_image": _proxy_image(ctx)}
    )
    spec = models.EnvironmentSpec(
        id=env_id,
        params=params,
        setup={"image": TEST_IMAGE, "workdir": "/tmp"},
        baseline_network_policy="public",
    )
    request = models.RunRequest(
        benchmark=models.BenchmarkSpec(id="corral-bench"),
        harness=models.HarnessSpec(id="none"),
        environment=spec,
        model=models.ModelSpec(id="none"),
    )
    # A run phase under no-network, so each provider makes what it needs to switch.
    plan = models.ExecutionPlan(
        environment=spec, run_network_policy={"network_mode": "no-network"}, task_id="bench"
    )
    return request, plan


async def _measure(ctx: Context, env_id: str) -> dict[str, list[float]]:
    contract: Any = importlib.import_module("corral.adapters.agentcompass.contract").load()
    importlib.import_module("corral.adapters.agentcompass")  # registers corral-docker
    importlib.import_module("agentcompass.environments.docker")  # registers docker
    env = contract.ENVIRONMENTS.create(env_id)
    request, plan = _request(ctx, env_id)
    no_network = contract.NetworkPolicy.from_value("no-network")
    public = contract.NetworkPolicy.from_value("public")
    samples: dict[str, list[float]] = {"open": [], "exec": [], "switch": []}
    for rep in range(1 + ctx.reps(5)):
        started = time.perf_counter()
        session = await env.open(request, plan)
        took = time.perf_counter() - started
        try:
            execs: list[float] = []
            for _ in range(ctx.reps(10)):
                started = time.perf_counter()
                await session.exec(["true"])
                execs.append(time.perf_counter() - started)
            started = time.perf_counter()
            await session.set_network_policy(no_network)
            switch = time.perf_counter() - started
            await session.set_network_policy(public)
        finally:
            await session.close()
        if rep:  # the first round warms the engine's caches
            samples["open"].append(took)
            samples["exec"] += execs
            samples["switch"].append(switch)
    return samples


async def run(ctx: Context) -> list[Row]:
    if find_spec("agentcompass") is None:
        return [Row("agentcompass docker: exec, open, switch", note=REASON)]
    mine = await _measure(ctx, "corral-docker")
    theirs = await _measure(ctx, "docker")
    names = {
        "open": "open (baseline public, run no-network)",
        "exec": "exec `true`",
        "switch": "switch → no-network",
    }
    return [
        Row(
            f"through AgentCompass: {label}",
            summarize(mine[key]),
            "AgentCompass docker",
            summarize(theirs[key]),
            note="corral enforces every mode at the transport layer; AgentCompass's "
            "allowlist is an HTTP proxy"
            if key == "switch"
            else "",
        )
        for key, label in names.items()
    ]
