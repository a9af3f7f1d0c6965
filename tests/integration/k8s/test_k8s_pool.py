"""The Kubernetes warm pool on a real cluster: a claimed Pod serves one session and goes
with it, claims never share a Pod (tasks of one process, or two processes), refills stay
within the size, a claim enforces the plan's baseline while an idle Pod is unreachable,
gc removes a dead harness's pool, other plans open cold, and the block drains."""

from __future__ import annotations

import json
import secrets
import sys
import textwrap
import time
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from anyio.abc import Process

from corral import EnvironmentSession, ExecutionPlan, NetworkSchedule
from corral.core.labels import OWNER, SESSION
from corral.core.session import ExecRequest
from corral.providers.k8s.channel import ChannelExecutor
from corral.providers.k8s.execution import Target, run_exec
from corral.providers.k8s.pod import BUSYBOX, CONTAINER, OPENED
from corral.providers.k8s.pool import CLAIMED, IDLE_UNTIL, POOL, STATE
from corral.providers.k8s.session import KubernetesSession
from corral.testing.plugin import EgressTarget
from tests.integration.conftest import wait_for
from tests.integration.k8s.conftest import TEST_IMAGE, env_config, make_env

pytestmark = pytest.mark.anyio

PLAN = ExecutionPlan(image=TEST_IMAGE, network="no-network")  # type: ignore[arg-type]


def new_owner() -> str:
    return f"corral-pool-{secrets.token_hex(3)}"


def owned(cluster: Any, namespace: str, owner: str) -> list[str]:
    """`owner`'s Pods and NetworkPolicies, by name (kind-prefixed)."""
    selector = f"{OWNER}={owner}"
    pods: Any = cluster.core.list_namespaced_pod(namespace, label_selector=selector)
    nps: Any = cluster.networking.list_namespaced_network_policy(namespace, label_selector=selector)
    return [f"pod/{p.metadata.name}" for p in pods.items] + [
        f"networkpolicy/{p.metadata.name}" for p in nps.items
    ]


def pool_pods(cluster: Any, namespace: str, pool_id: str) -> list[Any]:
    listed: Any = cluster.core.list_namespaced_pod(namespace, label_selector=f"{POOL}={pool_id}")
    return list(listed.items)


def unclaimed(cluster: Any, namespace: str, pool_id: str) -> list[str]:
    """The pool's Pods being made or idle (not claimed, not being deleted)."""
    return sorted(
        p.metadata.name
        for p in pool_pods(cluster, namespace, pool_id)
        if p.metadata.labels.get(STATE) != CLAIMED and p.metadata.deletion_timestamp is None
    )


async def all_gone(cluster: Any, namespace: str, owner: str) -> None:
    await wait_for(lambda: owned(cluster, namespace, owner) == [], time.time() + 90)


def pod_of(session: EnvironmentSession) -> str:
    assert isinstance(session, KubernetesSession)
    return session.target.pod


def read_pod(cluster: Any, namespace: str, name: str) -> Any:
    return cluster.core.read_namespaced_pod(name, namespace)


async def test_a_claimed_pod_serves_one_session_and_goes_with_it(
    cluster: Any, namespace: str
) -> None:
    owner = new_owner()
    env = make_env(namespace, owner=owner)
    async with env.warm_pool(PLAN, size_per_key=1) as pool:
        await pool.ready()
        (idle,) = unclaimed(cluster, namespace, pool.id)
        started = time.monotonic()
        session = await env.open(PLAN)
        claim_s = time.monotonic() - started
        try:
            # The fill's probe copied corral's helper: the claim trusts that, not the Pod.
            assert isinstance(session, KubernetesSession)
            executor = session.executor
            assert isinstance(executor, ChannelExecutor) and executor.copied
            assert executor.channel is None, "the claim itself ran nothing through it"
            assert (pool.hits, pool.misses) == (1, 0)
            assert pod_of(session) == idle
            pod = read_pod(cluster, namespace, idle)
            assert pod.metadata.labels[STATE] == CLAIMED
            assert IDLE_UNTIL not in pod.metadata.labels
            assert pod.metadata.annotations[OPENED] == "true"
            assert session.policy.network_mode.value == "no-network"
            assert (await session.exec("echo ok")).stdout == "ok\n"
            assert executor.unavailable is None and executor.channel is not None
            print(f"claim: {claim_s:.2f} s")
        finally:
            await env.close(session)
        await wait_for(
            lambda: f"pod/{idle}" not in owned(cluster, namespace, owner), time.time() + 60
        )
        assert f"networkpolicy/{idle}" not in owned(cluster, namespace, owner)
        await pool.ready()  # refilled in the background, by another Pod
        (refill,) = unclaimed(cluster, namespace, pool.id)
        assert refill != idle
        async with env.session(PLAN) as second:
            assert second.id != session.id and pod_of(second) == refill
        assert pool.hits == 2
    await all_gone(cluster, namespace, owner)


async def test_concurrent_opens_never_share_a_pod(cluster: Any, namespace: str) -> None:
    owner = new_owner()
    env = make_env(namespace, owner=owner)
    sessions: list[EnvironmentSession] = []

    async def take() -> None:
        sessions.append(await env.open(PLAN))

    async with env.warm_pool(PLAN, size_per_key=2) as pool:
        await pool.ready()
        pooled = set(unclaimed(cluster, namespace, pool.id))
        try:
            async with anyio.create_task_group() as tg:
                for _ in range(3):
                    tg.start_soon(take)
            assert (pool.hits, pool.misses) == (2, 1)
            pods = [pod_of(s) for s in sessions]
            assert len(set(pods)) == 3 and len({s.id for s in sessions}) == 3
            assert len(pooled & set(pods)) == 2
            uids = {read_pod(cluster, namespace, p).metadata.uid for p in pods}
            assert len(uids) == 3
        finally:
            for session in sessions:
                await env.close(session)
    await all_gone(cluster, namespace, owner)


# A second harness process: a pool that makes nothing (size 0) and claims from the
# parent's; waits for "go" on stdin so that both children claim at the same moment.
_CLAIMER = """
import anyio, json, sys
from corral import ExecutionPlan
from corral.providers.k8s import KubernetesConfig, KubernetesEnvironment

async def main() -> None:
    env = KubernetesEnvironment(KubernetesConfig.model_validate(json.loads(sys.argv[1])))
    plan = ExecutionPlan(image=sys.argv[2], network="no-network")
    async with env.warm_pool(plan, size_per_key=0) as pool:
        print("ready", flush=True)
        await anyio.to_thread.run_sync(sys.stdin.readline)
        session = await env.open(plan)
        out = (await session.exec(["echo", "ok"])).stdout
        print(json.dumps({"pod": session.target.pod, "hits": pool.hits, "lost": pool.lost,
                          "out": out}), flush=True)
        await env.close(session)

anyio.run(main)
"""


async def test_two_processes_never_claim_the_same_pod(cluster: Any, namespace: str) -> None:
    owner = new_owner()
    config = env_config(namespace, owner=owner)
    env = make_env(namespace, owner=owner)
    children: list[Process] = []
    try:
        async with env.warm_pool(PLAN, size_per_key=2) as pool:
            await pool.ready()
            pooled = set(unclaimed(cluster, namespace, pool.id))
            for _ in range(2):
                argv = [sys.executable, "-c", textwrap.dedent(_CLAIMER), json.dumps(config)]
                children.append(await anyio.open_process([*argv, TEST_IMAGE]))
            lines: list[bytes] = []

            async def line(child: Process) -> bytes:
                assert child.stdout is not None
                buffer = b""
                while not buffer.endswith(b"\n"):
                    buffer += await child.stdout.receive()
                return buffer

            for child in children:
                assert (await line(child)).strip() == b"ready"
            for child in children:  # both at once: each claims the oldest idle Pod first
                assert child.stdin is not None
                await child.stdin.send(b"go\n")

            async def result(child: Process) -> None:
                lines.append(await line(child))

            with anyio.fail_after(120):
                async with anyio.create_task_group() as tg:
                    for child in children:
                        tg.start_soon(result, child)
            seen = [json.loads(raw) for raw in lines]
            print(seen)
            assert [s["out"] for s in seen] == ["ok\n", "ok\n"]
            assert [s["hits"] for s in seen] == [1, 1], "each claimed one of the pool's Pods"
            assert {s["pod"] for s in seen} == pooled, "two Pods, each claimed once"
            for child in children:
                assert await child.wait() == 0
            await pool.ready()  # this pool saw its Pods claimed elsewhere, and refilled
            assert not pooled & set(unclaimed(cluster, namespace, pool.id))
    finally:
        for child in children:
            if child.returncode is None:
                child.kill()
            await child.aclose()
    await all_gone(cluster, namespace, owner)


async def test_the_pool_refills_and_never_exceeds_its_size(cluster: Any, namespace: str) -> None:
    owner = new_owner()
    env = make_env(namespace, owner=owner)
    counts: list[int] = []

    async def watch(pool_id: str) -> None:
        while True:
            found = await anyio.to_thread.run_sync(unclaimed, cluster, namespace, pool_id)
            counts.append(len(found))
            await anyio.sleep(0.2)

    async with (
        env.warm_pool(PLAN, size_per_key=2, max_idle_s=8) as pool,
        anyio.create_task_group() as tg,
    ):
        tg.start_soon(watch, pool.id)
        await pool.ready()
        first = set(unclaimed(cluster, namespace, pool.id))
        async with env.session(PLAN) as a, env.session(PLAN) as b:
            assert {pod_of(a), pod_of(b)} == first
            await pool.ready()  # refilled while both are in use
            second = set(unclaimed(cluster, namespace, pool.id))
            assert len(second) == 2 and not first & second
        await anyio.sleep(9)  # past the idle age: the pool replaces its stale Pods
        await pool.ready()
        third = set(unclaimed(cluster, namespace, pool.id))
        assert len(third) == 2 and not second & third
        tg.cancel_scope.cancel()
    assert pool.hits == 2
    assert max(counts) <= 2, counts
    await all_gone(cluster, namespace, owner)


async def tcp(session: EnvironmentSession, target: EgressTarget) -> bool:
    result = await session.exec(["nc", "-z", "-w", "3", target.host, str(target.port)])
    return result.returncode == 0


async def in_pod(cluster: Any, namespace: str, pod: str, container: str, argv: list[str]) -> int:
    """Run `argv` in a container of a Pod directly (no session): its exit code."""
    shell = (BUSYBOX, "sh") if container == CONTAINER else ("sh",)
    target = Target(cluster, namespace, pod, container, shell)
    result = await run_exec(target, ExecRequest(tuple(argv), timeout=30, output_limit=4096))
    return -1 if result.returncode is None else result.returncode


async def test_a_claim_enforces_the_plan_baseline_and_idle_pods_are_unreachable(
    cluster: Any, namespace: str, tcp_targets: list[EgressTarget], plain_server: str
) -> None:
    owner = new_owner()
    env = make_env(namespace, owner=owner)
    allowed, denied = tcp_targets
    policy = NetworkSchedule.model_validate({"baseline": f"allowlist:{allowed}"})
    allowlisted = PLAN.model_copy(update={"network": policy})
    public = ExecutionPlan(image=TEST_IMAGE, network="public")  # type: ignore[arg-type]
    async with env.warm_pool(PLAN, size_per_key=1) as pool:
        await pool.ready()
        (idle,) = unclaimed(cluster, namespace, pool.id)
        found: Any = cluster.networking.read_namespaced_network_policy(idle, namespace)
        assert found.spec.egress in (None, []) and found.spec.ingress in (None, [])
        dial = ["nc", "-z", "-w", "3", allowed.host, str(allowed.port)]
        assert await in_pod(cluster, namespace, idle, CONTAINER, dial) != 0
        # Ingress: a listener in the idle Pod, reached on its loopback but from no other Pod.
        listen = "(while :; do busybox nc -l -p 9100; done) </dev/null >/dev/null 2>&1 &"
        assert await in_pod(cluster, namespace, idle, "corral-probe", ["sh", "-c", listen]) == 0
        loopback = ["busybox", "nc", "-w", "2", "127.0.0.1", "9100", "-e", "true"]
        for _ in range(20):
            if await in_pod(cluster, namespace, idle, "corral-probe", loopback) == 0:
                break
            await anyio.sleep(0.1)
        else:
            raise AssertionError("the idle Pod's own listener never answered on loopback")
        address = read_pod(cluster, namespace, idle).status.pod_ip
        # A client Pod of its own (from an environment with no pool: `public` is the key
        # of PLAN too, since policies are not part of it).
        async with make_env(namespace, owner=owner).session(public) as client:
            assert await tcp(client, EgressTarget(plain_server, 9000)), "the client reaches Pods"
            assert not await tcp(client, EgressTarget(address, 9100)), "an idle Pod took a call"
        # The claim: same key, another baseline, patched and probed at claim time.
        async with env.session(allowlisted) as session:
            assert pool.hits == 1 and pod_of(session) == idle
            assert str(session.policy) == str(policy.baseline)
            assert (await tcp(session, allowed), await tcp(session, denied)) == (True, False)
            patched: Any = cluster.networking.read_namespaced_network_policy(idle, namespace)
            assert patched.metadata.uid == found.metadata.uid, "patched, never recreated"
            assert patched.spec.egress[0].to[0].ip_block.cidr == f"{allowed.host}/32"
    await all_gone(cluster, namespace, owner)


async def test_other_plans_open_cold(cluster: Any, namespace: str) -> None:
    owner = new_owner()
    env = make_env(namespace, owner=owner)
    other = PLAN.model_copy(update={"env": {"A": "1"}})
    async with env.warm_pool(PLAN, size_per_key=1) as pool:
        await pool.ready()
        (idle,) = unclaimed(cluster, namespace, pool.id)
        async with env.session(other) as session:
            assert pod_of(session) != idle
            assert POOL not in read_pod(cluster, namespace, pod_of(session)).metadata.labels
            assert (await session.exec("echo $A")).stdout == "1\n"
        assert (pool.hits, pool.misses, pool.idle()) == (0, 1, 1)
        assert unclaimed(cluster, namespace, pool.id) == [idle]
    await all_gone(cluster, namespace, owner)


async def test_leaving_the_pool_removes_every_idle_pod(cluster: Any, namespace: str) -> None:
    owner = new_owner()
    env = make_env(namespace, owner=owner)
    async with env.warm_pool(PLAN, size_per_key=2) as pool:
        await pool.ready()
        session = await env.open(PLAN)
    try:
        assert pool.idle() == 0
        left = [
            p.metadata.name
            for p in pool_pods(cluster, namespace, pool.id)
            if p.metadata.deletion_timestamp is None
        ]
        assert left == [pod_of(session)], "only the claimed Pod stays"
        assert (await session.exec("echo alive")).stdout == "alive\n"
    finally:
        await env.close(session)
    await all_gone(cluster, namespace, owner)
    with anyio.move_on_after(1.5):  # cancelled while its Pods are being made
        async with env.warm_pool(PLAN, size_per_key=2) as pool:
            await pool.ready()
    await all_gone(cluster, namespace, owner)


_ABANDON = """
import anyio, json, sys
from corral import ExecutionPlan
from corral.providers.k8s import KubernetesConfig, KubernetesEnvironment

async def main() -> None:
    env = KubernetesEnvironment(KubernetesConfig.model_validate(json.loads(sys.argv[1])))
    plan = ExecutionPlan(image=sys.argv[2], network="no-network")
    async with env.warm_pool(plan, size_per_key=1, max_idle_s=float(sys.argv[3])) as pool:
        await pool.ready()
        print(pool.id, flush=True)
        await anyio.sleep_forever()

anyio.run(main)
"""


@asynccontextmanager
async def abandoned_pool(config: dict[str, Any], idle_s: float) -> AsyncGenerator[str]:
    """A harness process that fills a pool, then is SIGKILLed (no drain); yields its id."""
    argv = [sys.executable, "-c", textwrap.dedent(_ABANDON), json.dumps(config), TEST_IMAGE]
    child = await anyio.open_process([*argv, str(idle_s)])
    try:
        assert child.stdout is not None
        with anyio.fail_after(120):
            pool_id = (await child.stdout.receive()).decode().strip()
    finally:
        child.kill()  # what a crashed harness leaves behind
        await child.wait()
        await child.aclose()
    yield pool_id


async def test_gc_removes_a_dead_harness_pool(cluster: Any, namespace: str) -> None:
    owner = new_owner()
    idle_s = 10
    async with abandoned_pool(env_config(namespace, owner=owner), idle_s) as pool_id:
        made_at = time.time()
        (idle,) = unclaimed(cluster, namespace, pool_id)
        env = make_env(namespace, owner=owner)
        assert await env.gc() == [], "not idle long enough yet"
        until = int(read_pod(cluster, namespace, idle).metadata.labels[IDLE_UNTIL])
        assert until <= made_at + idle_s + 1
        await anyio.sleep(max(0.0, until + 1 - time.time()))
        removed = await env.gc()
        assert removed == [f"idle pooled Pod {idle}"]
    await all_gone(cluster, namespace, owner)


async def test_gc_spares_a_claimed_pod_past_its_idle_age(cluster: Any, namespace: str) -> None:
    owner = new_owner()
    env = make_env(namespace, owner=owner)
    async with env.warm_pool(PLAN, size_per_key=1, max_idle_s=5) as pool:
        await pool.ready()
        async with env.session(PLAN) as session:
            assert pool.hits == 1
            await anyio.sleep(6)
            removed = await make_env(namespace, owner=owner).gc()
            assert f"idle pooled Pod {pod_of(session)}" not in removed
            assert read_pod(cluster, namespace, pod_of(session)).metadata.labels[SESSION]
            assert (await session.exec("echo alive")).stdout == "alive\n"
    await all_gone(cluster, namespace, owner)
