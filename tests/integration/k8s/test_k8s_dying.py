"""The sandbox Pod deleted while an exec runs: the exec ends within seconds with a clear
outcome (never a hang), the session runs no other command, and `close` cleans up."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from corral import ExecutionPlan, NetworkPolicy, NetworkSchedule
from corral.errors import CorralError
from corral.providers.k8s.session import KubernetesSession
from tests.integration.disrupt import exec_while
from tests.integration.k8s.conftest import TEST_IMAGE, make_env

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
