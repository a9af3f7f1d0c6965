"""The benchmark cases, in the order they run; each returns rows for the table."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from bench.cases import (
    admission,
    agentcompass,
    docker_concurrency,
    docker_exec,
    docker_open,
    docker_policy,
    docker_pool,
    docker_processes,
    docker_runtime,
    docker_scale,
    docker_transfer,
    k8s,
    k8s_kwok,
)
from bench.context import Context
from bench.report import Row

Case = Callable[[Context], Awaitable[list[Row]]]

CASES: dict[str, Case] = {
    "exec": docker_exec.run,
    "processes": docker_processes.run,
    "open": docker_open.run,
    "pool": docker_pool.run,
    "transfer": docker_transfer.run,
    "policy": docker_policy.run,
    "gvisor": docker_runtime.run,
    "concurrency": docker_concurrency.run,
    "scale": docker_scale.run,
    "admission": admission.run,
    "agentcompass": agentcompass.run,
    "k8s": k8s.run,
    "kwok": k8s_kwok.run,
}
