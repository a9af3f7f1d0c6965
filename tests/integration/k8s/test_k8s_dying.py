"""The sandbox Pod deleted while an exec runs: the exec ends within seconds with a clear
outcome (never a hang), the session runs no other command, and `close` cleans up. A
harness SIGKILLed between creating the Pod and making it its NetworkPolicy's owner leaves
a policy that `corral gc` gives to that Pod, so it goes with it."""

from __future__ import annotations

import json
import secrets
import signal
import sys
import time
from typing import Any

import anyio
import pytest

from corral import ExecutionPlan, NetworkPolicy, NetworkSchedule
from corral.core.labels import OWNER
from corral.errors import CorralError
from corral.providers.k8s.session import KubernetesSession
from tests.integration.abandoned_harness import ROOT
from tests.integration.conftest import wait_for
from tests.integration.disrupt import exec_while
from tests.integration.k8s.conftest import TEST_IMAGE, env_config, make_env

pytestmark = pytest.mark.anyio


async def test_pod_deleted_mid_exec(cluster: Any, namespace: str) -> None:
    env = make_env(namespace)
    plan = ExecutionPlan(
        image=TEST_IMAGE, network=NetworkSchedule(baseline=NetworkPolicy.no_network())
    )
    session = await env.open(plan)
    assert isinstance(session, KubernetesSession)
    try:
        outcome, took = await exec_while(
            session,
            lambda: cluster.core.delete_namespaced_pod(
                session.target.pod, namespace, grace_period_seconds=0
            ),
        )
        assert took < 20, outcome
        assert outcome != "returned 0", outcome
        with anyio.fail_after(60):
            while True:  # the Pod is gone for good: no command runs in a successor
                try:
                    after = await session.exec(["true"])
                except CorralError:
                    break
                assert after.returncode != 0, "a command ran in a deleted sandbox"
                await anyio.sleep(1)
    finally:
        await env.close(session)


# A harness whose open is SIGKILLed the moment it would make the Pod its policy's owner.
KILLED_IN_OWN = """
import json, os, signal, sys, anyio
from corral import ENVIRONMENTS, ExecutionPlan
from corral.providers.k8s.objects import Objects
async def own(*_):
    os.kill(os.getpid(), signal.SIGKILL)
Objects.own = own
env = ENVIRONMENTS.create("k8s", **json.loads(sys.argv[1]))
anyio.run(env.open, ExecutionPlan(image=sys.argv[2]))
"""


async def test_gc_gives_the_policy_of_a_harness_killed_before_own_to_its_pod(
    cluster: Any, namespace: str
) -> None:
    owner = f"corral-test-{secrets.token_hex(4)}"
    selector = f"{OWNER}={owner}"
    argv = [sys.executable, "-c", KILLED_IN_OWN, json.dumps(env_config(namespace, owner=owner))]
    child = await anyio.run_process([*argv, TEST_IMAGE], cwd=ROOT, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]

    def policies() -> list[Any]:
        found: Any = cluster.networking.list_namespaced_network_policy(
            namespace, label_selector=selector
        )
        return list(found.items)

    try:
        (policy,) = policies()
        assert not policy.metadata.owner_references
        await make_env(namespace, owner=owner).gc()
        # The Pod goes (evicted, deleted by hand, or by gc at its expiry): its policy too.
        pods: Any = cluster.core.list_namespaced_pod(namespace, label_selector=selector)
        (pod,) = pods.items
        cluster.core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
        await wait_for(lambda: policies() == [], time.time() + 30)
    finally:
        for left in policies():
            cluster.networking.delete_namespaced_network_policy(left.metadata.name, namespace)
