"""Many Pods at once: `pods` sandboxes opened concurrently on the one-node cluster, each
with `no-network` enforced and probed (the provider does both at open), then closed
concurrently; beside it, the same count of plain Pods created at once and waited Ready.

The baseline is the kubernetes Python client (the one corral uses), one thread per Pod
for the create and one watch for Ready — what `kubectl run` + `kubectl wait` do, without
200 kubectl processes competing with the cluster for 2 cores. Its Pod is `kubectl run`'s
(the test image, `sleep 3600`, restartPolicy Never, no NetworkPolicy).

Leaks are counted by corral's owner label right after the last close: Pods and
NetworkPolicies still there and not being deleted. The run then waits until the cluster
has removed them all (the drain), so the baseline starts on an empty node.
"""

from __future__ import annotations

import contextlib
import importlib
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from typing import Any

import anyio

from bench.context import RAW, TEST_IMAGE
from bench.report import Row, ratio_at_most
from bench.stats import summarize
from corral import ExecutionPlan
from corral.core.labels import OWNER
from corral.core.session import EnvironmentSession
from corral.providers.k8s import KubernetesEnvironment

#: The kubernetes client is only partly typed; its objects are Any at this boundary.
k8s_config: Any = importlib.import_module("kubernetes.config")
k8s_watch: Any = importlib.import_module("kubernetes.watch")
ApiException: type[Exception] = importlib.import_module("kubernetes.client").ApiException

FULL = 100
TARGET = 1.2
READY_WITHIN_S = 600
REWATCH_PAUSE_S = 0.2
DRAIN_WITHIN_S = 300


class TimedK8s(KubernetesEnvironment):
    """The provider, recording how long each open took once it held the open limiter
    (`max_concurrent_opens`): the rest of an open's time is its wait in the queue."""

    service: list[float]

    async def _open(
        self, plan: ExecutionPlan, owned: AsyncExitStack, *, session_id: str | None
    ) -> EnvironmentSession:
        started = time.perf_counter()
        session = await super()._open(plan, owned, session_id=session_id)
        self.service.append(time.perf_counter() - started)
        return session


def _ready(pod: Any) -> bool:
    conditions: list[Any] = (pod.status.conditions or []) if pod.status else []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def objects_left(core: Any, networking: Any, namespace: str, selector: str) -> tuple[int, int]:
    """(objects carrying `selector` and not being deleted, all objects carrying it)."""
    items: list[Any] = [
        *core.list_namespaced_pod(namespace, label_selector=selector).items,
        *networking.list_namespaced_network_policy(namespace, label_selector=selector).items,
    ]
    alive = [i for i in items if i.metadata.deletion_timestamp is None]
    return len(alive), len(items)


def drain(core: Any, networking: Any, namespace: str, selector: str) -> float:
    started = time.perf_counter()
    while objects_left(core, networking, namespace, selector)[1]:
        if time.perf_counter() - started > DRAIN_WITHIN_S:
            raise RuntimeError(f"objects labelled {selector} still there after {DRAIN_WITHIN_S} s")
        time.sleep(0.5)
    return time.perf_counter() - started


def baseline(
    core: Any,
    namespace: str,
    selector: str,
    pods: int,
    *,
    workers: int | None = None,
    placement: dict[str, Any] | None = None,
) -> tuple[list[float], float]:
    """Per-Pod create → Ready, and the wall time from the first create to the last Ready:
    `pods` Pods created by `workers` threads (default: one each), with `placement` (a node
    selector, tolerations) added to their spec."""
    key, value = selector.split("=")
    created: dict[str, float] = {}
    ready: dict[str, float] = {}
    watching = threading.Event()
    stopped = threading.Event()
    watch = k8s_watch.Watch()

    def note(pod: Any) -> None:
        if pod.metadata.name not in ready and _ready(pod):
            ready[pod.metadata.name] = time.perf_counter()

    def observe() -> None:
        # A watch the API server ends early (under load, or a version gone stale) is
        # taken up again from a fresh list, so that no Pod's Ready is missed.
        deadline = time.monotonic() + READY_WITHIN_S
        while len(ready) < pods and not stopped.is_set():
            left = int(deadline - time.monotonic())
            if left <= 0:
                return
            with contextlib.suppress(ApiException):
                listed = core.list_namespaced_pod(namespace, label_selector=selector)
                for pod in listed.items:
                    note(pod)
                watching.set()
                stream = watch.stream(
                    core.list_namespaced_pod,
                    namespace,
                    label_selector=selector,
                    resource_version=listed.metadata.resource_version,
                    timeout_seconds=left,
                )
                for event in stream:
                    note(event["object"])
                    if len(ready) == pods:
                        watch.stop()
            stopped.wait(REWATCH_PAUSE_S)

    def create(index: int) -> None:
        name = f"bench-scale-{index}"
        body = {
            "metadata": {"name": name, "labels": {key: value, "run": name}},
            "spec": {
                **(placement or {}),
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": name,
                        "image": TEST_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["sleep", "3600"],
                    }
                ],
            },
        }
        created[name] = time.perf_counter()
        core.create_namespaced_pod(namespace, body)

    watcher = threading.Thread(target=observe, daemon=True)
    watcher.start()
    # Until the first list answered; a watcher that died (an error it does not retry) has
    # nothing to wait for.
    while not watching.wait(1) and watcher.is_alive():
        pass
    try:
        with ThreadPoolExecutor(max_workers=workers or pods) as pool:
            list(pool.map(create, range(pods)))
    except BaseException:
        stopped.set()
        watch.stop()
        raise
    watcher.join()
    times = [ready[n] - created[n] for n in created if n in ready]
    wall = max(ready.values(), default=time.perf_counter()) - min(created.values())
    return times, wall


async def scale_rows(
    env: KubernetesEnvironment, kubeconfig: str, plan: ExecutionPlan, pods: int
) -> list[Row]:
    """`pods` sandboxes at once on `env`'s cluster and namespace, then the baseline."""
    cfg = env.config
    timed_env = TimedK8s(cfg)
    timed_env.service = []
    client = k8s_config.new_client_from_config(config_file=kubeconfig)
    client.configuration.connection_pool_maxsize = pods + 4
    core: Any = importlib.import_module("kubernetes.client").CoreV1Api(client)
    networking: Any = importlib.import_module("kubernetes.client").NetworkingV1Api(client)
    namespace = cfg.namespace
    mine = f"{OWNER}={cfg.owner}"

    opens: list[float] = []
    errors: list[BaseException] = []
    sessions: list[EnvironmentSession] = []

    async def one() -> None:
        started = time.perf_counter()
        try:
            session = await timed_env.open(plan)
        except Exception as exc:
            errors.append(exc)
            return
        opens.append(time.perf_counter() - started)
        sessions.append(session)

    started = time.perf_counter()
    try:
        async with anyio.create_task_group() as group:
            for _ in range(pods):
                group.start_soon(one)
        wall = time.perf_counter() - started
    finally:
        closing = time.perf_counter()
        async with anyio.create_task_group() as group:
            for session in sessions:
                group.start_soon(timed_env.close, session)
        close_wall = time.perf_counter() - closing
    leaks, _ = await anyio.to_thread.run_sync(objects_left, core, networking, namespace, mine)
    drained = await anyio.to_thread.run_sync(drain, core, networking, namespace, mine)

    raw = f"{RAW}={cfg.owner}"
    try:
        runs, raw_wall = await anyio.to_thread.run_sync(baseline, core, namespace, raw, pods)
    finally:
        await anyio.to_thread.run_sync(
            lambda: core.delete_collection_namespaced_pod(
                namespace, label_selector=raw, grace_period_seconds=0
            )
        )
        await anyio.to_thread.run_sync(drain, core, networking, namespace, raw)
    client.close()

    label = f"k8s: {pods} Pods opened at once, no-network enforced"
    limit = type(env).max_concurrent_opens
    service = statistics.median(timed_env.service) if timed_env.service else 0.0
    corral_open, raw_open = summarize(opens or [0.0]), summarize(runs or [0.0])
    corral_wall, raw_walls = summarize([wall]), summarize([raw_wall])
    baseline_name = f"create + watch Ready, {pods} at once (Python client, no policy)"
    return [
        Row(
            f"{label}: open",
            corral_open,
            baseline_name,
            raw_open,
            target=f"p50 ≤ {TARGET}x",
            met=bool(opens) and ratio_at_most(corral_open, raw_open, TARGET),
            note=f"queue included; p50 {service:.2f} s once past the limit of {limit} opens",
        ),
        Row(
            f"{label}: wall",
            corral_wall,
            baseline_name,
            raw_walls,
            target=f"≤ {TARGET}x",
            met=ratio_at_most(corral_wall, raw_walls, TARGET),
            note=f"closing all {close_wall:.1f} s, cluster removed them in {drained:.1f} s more"
            + (f"; {pods - len(runs)} baseline Pods never Ready" if len(runs) < pods else ""),
        ),
        *outcome_rows(label, "failures", errors, leaks),
    ]


def outcome_rows(label: str, failed: str, errors: list[BaseException], leaks: int) -> list[Row]:
    """What failed (the first error in the note) and what was left, both with target 0."""
    return [
        Row(
            f"{label}: {failed}",
            summarize([float(len(errors))]),
            unit="count",
            target="0",
            met=not errors,
            note=f"first: {errors[0]!r}" if errors else "",
        ),
        Row(
            f"{label}: leaked Pods + NetworkPolicies",
            summarize([float(leaks)]),
            unit="count",
            target="0",
            met=leaks == 0,
        ),
    ]
