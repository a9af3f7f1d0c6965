"""Thousands of sandboxes through one harness process: 1,000 and 5,000 (1,000 alone with
--quick) opened at once against the test cluster's API server, kept open together, then
closed at once.

The Pods land on fake nodes that kwok (`tests/integration/cluster/build.sh kwok`) plays the
kubelet of: it marks each Pod Running and Ready as a kubelet would and removes deleted
ones. The nodes are tainted and selected by this run's own label, so nothing else lands
there, and they and kwok go at the end. No container runs on them, so the environment
opens with `verify_policy="off"` (the probe needs a container) and the workload gate's one
exec is left out (`_Kwok._open_gate`); the `k8s` case times both on the real node. What
is left is what a harness pays per session on the API side: the open (its queue for the
open limiter included), the event loop's worst lag, the harness's Python heap per live
session, the API requests per open (counted at the kubernetes client's one REST entry
point), the time to close all, and what is left. Beside it, the kubernetes Python client
creates as many of `kubectl run`'s Pods on the same nodes from as many threads as corral's
open limit, with one watch for Ready: its wall, and the worst lag of an otherwise idle
event loop while its threads run (what any harness driving that client from threads pays).
"""

from __future__ import annotations

import functools
import gc
import importlib
import math
import os
import statistics
import subprocess
import time
import tracemalloc
from collections.abc import Callable, Generator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import anyio
from anyio.abc import Process

from bench.cases.k8s_scale import TimedK8s, baseline, drain, objects_left, outcome_rows
from bench.context import RAW, TEST_IMAGE, Context
from bench.lag import HostLag, LagMonitor, full_collection_s
from bench.report import Row
from bench.stats import summarize
from corral import ExecutionPlan
from corral.core.labels import OWNER
from corral.core.session import EnvironmentSession
from corral.providers.k8s import KubernetesConfig, KubernetesEnvironment
from corral.providers.k8s.session import KubernetesSession

#: The kubernetes client is only partly typed; its objects are Any at this boundary.
k8s_client: Any = importlib.import_module("kubernetes.client")
k8s_config: Any = importlib.import_module("kubernetes.config")
k8s_rest: Any = importlib.import_module("kubernetes.client.rest")

COUNTS = (1000, 5000)
CACHE = anyio.Path("/var/cache/corral/cluster")
NODES = 30
#: kwok's taint, and the label this run's nodes carry (its value is the run's owner)
TAINT = "kwok.x-k8s.io/node"
NODE_LABEL = "corral.bench/kwok"
#: never dialled: nothing execs on a fake node
NODE_IP = "192.0.2.250"
LAG_TARGET_S = 0.05
HEAP_SAMPLE = 100


class _Kwok(TimedK8s):
    """The provider, timed, without the workload gate's exec, which needs a container."""

    async def _open_gate(self, session: KubernetesSession) -> None:
        return None


@contextmanager
def _counted() -> Generator[list[int]]:
    """Every request the kubernetes client sends, counted while the block runs."""
    count = [0]
    original: Callable[..., Any] = k8s_rest.RESTClientObject.request

    def request(self: Any, *args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return original(self, *args, **kwargs)

    k8s_rest.RESTClientObject.request = request
    try:
        yield count
    finally:
        k8s_rest.RESTClientObject.request = original


@asynccontextmanager
async def _fake_nodes(core: Any, kwok: str, kubeconfig: str, ctx: Context, pods: int):
    """kwok (its log in the run's workspace), and NODES fake nodes of this run's with
    room for `pods` Pods, until the end."""
    owner = ctx.owner
    log = await anyio.to_thread.run_sync((ctx.workspace / "kwok.log").open, "wb")
    names = [f"{owner}-kwok-{i}" for i in range(NODES)]
    room = str(math.ceil(pods / NODES) + 10)
    capacity = {"cpu": "1000", "memory": "1000Gi", "pods": room}
    process: Process = await anyio.open_process(
        [
            kwok,
            "--kubeconfig",
            kubeconfig,
            f"--manage-nodes-with-label-selector={NODE_LABEL}={owner}",
            "--node-ip",
            NODE_IP,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        for name in names:
            body = {
                "metadata": {"name": name, "labels": {NODE_LABEL: owner, OWNER: owner}},
                "spec": {"taints": [{"key": TAINT, "value": "fake", "effect": "NoSchedule"}]},
                "status": {"capacity": capacity, "allocatable": capacity},
            }
            await anyio.to_thread.run_sync(core.create_node, body)
        yield
    finally:
        with anyio.CancelScope(shield=True):
            for name in names:
                await anyio.to_thread.run_sync(lambda n=name: _gone(core.delete_node, n))
            process.terminate()
            await process.wait()
            log.close()


def _gone(delete: Callable[[str], Any], name: str) -> None:
    """`delete(name)`, where an object already gone counts as deleted."""
    try:
        delete(name)
    except k8s_client.ApiException as exc:
        if exc.status != 404:
            raise


async def run(ctx: Context) -> list[Row]:
    kubeconfig = os.environ.get("KUBECONFIG") or "/var/lib/corral-cluster/admin.kubeconfig"
    found = sorted([str(p) async for p in CACHE.glob("kwok-*/bin/kwok")])
    label = "k8s on kwok's fake nodes"
    if not found or not await anyio.Path(kubeconfig).exists():
        reason = (
            "skipped: no kwok or no cluster; run tests/integration/cluster/build.sh kwok "
            "and tests/integration/cluster/up.sh"
        )
        return [Row(label, note=reason)]
    configuration = k8s_client.Configuration()
    k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    # the baseline's threads, its watch and the bench's own calls, each a connection
    configuration.connection_pool_maxsize = KubernetesEnvironment.max_concurrent_opens + 4
    client = k8s_client.ApiClient(configuration)
    core = k8s_client.CoreV1Api(client)
    # --quick: 1,000 alone, the smaller count, keeping the quick run under 10 min
    counts = COUNTS if ctx.scale >= 1 else (ctx.reps(COUNTS[-1]),)
    rows: list[Row] = []
    try:
        async with _fake_nodes(core, found[-1], kubeconfig, ctx, max(counts)):
            for count in counts:
                rows += await _rows(ctx, client, kubeconfig, count)
    finally:
        client.close()
    return rows


async def _rows(ctx: Context, client: Any, kubeconfig: str, count: int) -> list[Row]:
    """`count` sandboxes opened at once on the fake nodes, held, then closed at once."""
    namespace = f"{ctx.owner}-kwok-{count}"
    toleration = {"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}
    config = KubernetesConfig(
        kubeconfig=kubeconfig,
        namespace=namespace,
        create_namespace=True,
        image_pull_policy="Never",
        owner=ctx.owner,
        verify_policy="off",
        node_selector={NODE_LABEL: ctx.owner},
        tolerations=(toleration,),
    )
    plan = ExecutionPlan.model_validate({"image": TEST_IMAGE, "network": "no-network"})
    core = k8s_client.CoreV1Api(client)
    networking = k8s_client.NetworkingV1Api(client)
    env = _Kwok(config)
    env.service = []
    opens: list[float] = []
    errors: list[BaseException] = []
    sessions: list[EnvironmentSession] = []

    async def one() -> None:
        started = time.perf_counter()
        try:
            sessions.append(await env.open(plan))
        except Exception as exc:
            errors.append(exc)
            return
        opens.append(time.perf_counter() - started)

    monitor = LagMonitor()
    wall = per_open = close_wall = raw_wall = idle_gc = 0.0
    try:
        with _counted() as requests:
            await env.close(await env.open(plan))  # the namespace, its service account
            before = requests[0]
            idle_gc = full_collection_s()
            async with HostLag() as host, anyio.create_task_group() as ticking:
                ticking.start_soon(monitor.run)
                started = time.perf_counter()
                async with anyio.create_task_group() as group:
                    for _ in range(count):
                        group.start_soon(one)
                wall = time.perf_counter() - started
                per_open = (requests[0] - before) / max(1, len(sessions))
                closing = time.perf_counter()
                async with anyio.create_task_group() as group:
                    for session in sessions:
                        group.start_soon(env.close, session)
                close_wall = time.perf_counter() - closing
                ticking.cancel_scope.cancel()
        per_session = await _heap_per_session(env, plan)
        mine = f"{OWNER}={ctx.owner}"
        leaks, _ = await anyio.to_thread.run_sync(objects_left, core, networking, namespace, mine)
        drained = await anyio.to_thread.run_sync(drain, core, networking, namespace, mine)
        placement = {"nodeSelector": {NODE_LABEL: ctx.owner}, "tolerations": [toleration]}
        raw = f"{RAW}={ctx.owner}"
        workers = env.max_concurrent_opens
        make = functools.partial(
            baseline, core, namespace, raw, count, workers=workers, placement=placement
        )
        raw_monitor = LagMonitor()
        async with anyio.create_task_group() as ticking:
            ticking.start_soon(raw_monitor.run)
            _, raw_wall = await anyio.to_thread.run_sync(make)
            ticking.cancel_scope.cancel()
        await anyio.to_thread.run_sync(
            lambda: core.delete_collection_namespaced_pod(
                namespace, label_selector=raw, grace_period_seconds=0
            )
        )
        await anyio.to_thread.run_sync(drain, core, networking, namespace, raw)
    finally:
        await env.aclose()
        await anyio.to_thread.run_sync(lambda: _gone(core.delete_namespace, namespace))
    case = f"k8s: {count} sandboxes through one process (kwok)"
    ordered = sorted(opens or [0.0])
    p99 = ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]
    threads = f"the Python client, {workers} threads: create + watch Ready (no policy)"
    return [
        Row(
            f"{case}: open",
            summarize(opens or [0.0]),
            note=f"p99 {p99:.2f} s; queue for the limit of {env.max_concurrent_opens} opens "
            f"included, {statistics.median(env.service or [0.0]):.2f} s past it",
        ),
        Row(f"{case}: all open (wall)", summarize([wall]), threads, summarize([raw_wall])),
        Row(
            f"{case}: event-loop worst lag",
            summarize([monitor.worst_s]),
            f"{threads}, on an idle loop",
            summarize([raw_monitor.worst_s]),
            target=f"≤ {LAG_TARGET_S * 1000:.0f} ms",
            met=monitor.worst_s <= LAG_TARGET_S,
            note=f"a separate idle process's worst lag {host.worst_s * 1000:.0f} ms; "
            f"floor: {monitor.gc_note()}; a full collection with no session live takes "
            f"{idle_gc * 1000:.0f} ms; {monitor.stall_note()}",
        ),
        Row(
            f"{case}: harness memory per live session",
            summarize([per_session / 1024]),
            unit="KiB",
            note=f"Python heap (tracemalloc) of {HEAP_SAMPLE} more sessions held after the round",
        ),
        Row(f"{case}: API requests per open", summarize([per_open]), unit="count"),
        Row(
            f"{case}: close all at once",
            summarize([close_wall]),
            note=f"the cluster removed them in {drained:.1f} s more",
        ),
        *outcome_rows(case, "failed opens", errors, leaks),
    ]


async def _heap_per_session(env: KubernetesEnvironment, plan: ExecutionPlan) -> float:
    """The Python heap each live session holds: HEAP_SAMPLE more opened and held under
    tracemalloc (which slows every allocation, so not during the timed round)."""
    sessions: list[EnvironmentSession] = []

    async def one() -> None:
        sessions.append(await env.open(plan))

    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        async with anyio.create_task_group() as group:
            for _ in range(HEAP_SAMPLE):
                group.start_soon(one)
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        async with anyio.create_task_group() as group:
            for session in sessions:
                group.start_soon(env.close, session)
    return held / HEAP_SAMPLE
