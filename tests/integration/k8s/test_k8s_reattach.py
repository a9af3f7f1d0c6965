"""Reattaching `k8s` sandboxes by session id: idempotent opens, attach from another process,
the policy read back from the cluster, and close() of an attached session."""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral import (
    ConfigError,
    EnvironmentSession,
    ExecutionPlan,
    NetworkPolicy,
    NetworkSchedule,
    ProviderError,
    SessionNotFound,
)
from corral.providers.k8s import KubernetesEnvironment
from tests.integration.conftest import ALLOWED_IP, wait_for
from tests.integration.k8s.conftest import TEST_IMAGE, env_config, make_env

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).parents[3]
SWITCHED = NetworkPolicy.allowlist(f"{ALLOWED_IP}:80")

# Run by a second interpreter: attach by id, run a command, report what it saw.
CHILD = """
import anyio, json, sys
from corral.providers.k8s import KubernetesEnvironment

async def main() -> None:
    env = KubernetesEnvironment(**json.loads(sys.argv[1]))
    session = await env.attach(sys.argv[2])
    result = await session.exec(["cat", "/tmp/note"])
    print(json.dumps({"id": session.id, "policy": str(session.policy), "out": result.stdout}))

anyio.run(main)
"""


def plan(policy: str = "public") -> ExecutionPlan:
    return ExecutionPlan(
        image=TEST_IMAGE, network=NetworkSchedule.model_validate({"baseline": policy})
    )


def new_id() -> str:
    return f"it-{secrets.token_hex(4)}"


def session_objects(cluster: Any, namespace: str, session_id: str) -> dict[str, list[Any]]:
    """The session's Pods and NetworkPolicies, by its label."""
    selector = f"corral.session={session_id}"
    pods: Any = cluster.core.list_namespaced_pod(namespace, label_selector=selector)
    nps: Any = cluster.networking.list_namespaced_network_policy(namespace, label_selector=selector)
    return {"pods": list(pods.items), "policies": list(nps.items)}


async def gone(cluster: Any, namespace: str, session_id: str) -> None:
    def empty() -> bool:
        return session_objects(cluster, namespace, session_id) == {"pods": [], "policies": []}

    await wait_for(empty, time.time() + 60)


@asynccontextmanager
async def named_sandbox(
    cluster: Any, namespace: str, env: KubernetesEnvironment
) -> AsyncGenerator[EnvironmentSession]:
    """A public sandbox opened with a session id of its own, closed and shown gone after."""
    sid = new_id()
    sandbox = await env.open(plan(), session_id=sid)
    try:
        yield sandbox
    finally:
        await env.close(sandbox)
    await gone(cluster, namespace, sid)


async def test_opening_an_id_twice_is_one_pod(
    cluster: Any, namespace: str, k8s_env: KubernetesEnvironment
) -> None:
    async with named_sandbox(cluster, namespace, k8s_env) as first:
        second = await k8s_env.open(plan("no-network"), session_id=first.id)
        found = session_objects(cluster, namespace, first.id)
        assert [p.metadata.name for p in found["pods"]] == [f"corral-{first.id}"]
        assert len(found["policies"]) == 1
        assert second.id == first.id
        # Reattached as it is: the policy it has, not the second plan's baseline.
        assert second.policy == NetworkPolicy.public()
        await second.write_text("/tmp/shared", "one sandbox")
        assert await first.read_text("/tmp/shared") == "one sandbox"


async def test_another_process_attaches_and_sees_the_switched_policy(
    cluster: Any, namespace: str, k8s_env: KubernetesEnvironment
) -> None:
    async with named_sandbox(cluster, namespace, k8s_env) as sandbox:
        await sandbox.write_text("/tmp/note", "written by the parent")
        await sandbox.set_network_policy(SWITCHED)
        argv = [sys.executable, "-c", CHILD, json.dumps(env_config(namespace)), sandbox.id]
        environ = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        child = await anyio.run_process(argv, env=environ, cwd=ROOT, check=False)
        assert child.returncode == 0, child.stderr.decode()
        seen = json.loads(child.stdout.decode().strip().splitlines()[-1])
        assert seen == {"id": sandbox.id, "policy": str(SWITCHED), "out": "written by the parent"}
        # The child did not close it: the sandbox is still there.
        assert len(session_objects(cluster, namespace, sandbox.id)["pods"]) == 1


async def test_nothing_the_pods_root_writes_changes_what_attach_reports(
    cluster: Any, namespace: str, k8s_env: KubernetesEnvironment
) -> None:
    async with named_sandbox(cluster, namespace, k8s_env) as sandbox:
        await sandbox.set_network_policy(SWITCHED)
        # Root in the Pod forges every place a policy or an "opened" mark could be read
        # from inside it, and looks for an API token to patch the NetworkPolicy with.
        forged = await sandbox.exec(
            "id -u; echo public > /tmp/.corral-policy; rm -f /tmp/.corral-ready; "
            'echo \'{"network_mode": "public"}\' > /.corral-policy; '
            "echo '10.0.0.1 kubernetes.default.svc' >> /etc/hosts; "
            "ls /var/run/secrets/kubernetes.io/serviceaccount 2>&1"
        )
        assert forged.stdout.splitlines()[0] == "0", "the workload must be root for this test"
        assert "No such file" in forged.stdout, "the Pod holds an API token"
        attached = await make_env(namespace).attach(sandbox.id)
        assert attached.policy == SWITCHED
        (np,) = session_objects(cluster, namespace, sandbox.id)["policies"]
        assert np.spec.egress[0].to[0].ip_block.cidr == f"{ALLOWED_IP}/32"


async def test_attach_refuses_a_policy_it_cannot_read_back(
    cluster: Any, namespace: str, k8s_env: KubernetesEnvironment
) -> None:
    async with named_sandbox(cluster, namespace, k8s_env) as sandbox:
        name = f"corral-{sandbox.id}"
        for garbled in ('{"network_mode": "allowlist"}', None):
            patch = {"metadata": {"annotations": {"corral.policy": garbled}}}
            cluster.networking.patch_namespaced_network_policy(name, namespace, patch)
            with pytest.raises(ProviderError, match=f"{name}.*corral.policy"):
                await make_env(namespace).attach(sandbox.id)


async def test_concurrent_opens_of_one_id_make_one_pod(cluster: Any, namespace: str) -> None:
    sid = new_id()
    envs = [make_env(namespace), make_env(namespace)]
    sessions: list[Any] = []

    async def open_one(env: KubernetesEnvironment) -> None:
        sessions.append(await env.open(plan(), session_id=sid))

    try:
        async with anyio.create_task_group() as group:
            for env in envs:
                group.start_soon(open_one, env)
        found = session_objects(cluster, namespace, sid)
        assert len(found["pods"]) == 1 and len(found["policies"]) == 1
        assert [s.id for s in sessions] == [sid, sid]
        for session in sessions:
            assert (await session.exec(["true"])).returncode == 0
    finally:
        for session in sessions:
            assert session.environment is not None
            await session.environment.close(session)
    await gone(cluster, namespace, sid)


async def test_attach_unknown_or_bad_ids(k8s_env: KubernetesEnvironment) -> None:
    with pytest.raises(SessionNotFound, match="'nonexistent'"):
        await k8s_env.attach("nonexistent")
    with pytest.raises(ConfigError, match="'Bad_ID'"):
        await k8s_env.attach("Bad_ID")


async def test_closing_an_attached_session_leaves_nothing(
    cluster: Any, namespace: str, k8s_env: KubernetesEnvironment
) -> None:
    sid = new_id()
    sandbox = await k8s_env.open(plan("no-network"), session_id=sid)
    other = make_env(namespace)
    attached = await other.attach(sid)
    assert await attached.endpoint(80) is not None  # a port-forward the close must end too
    await other.close(attached)
    await gone(cluster, namespace, sid)
    await k8s_env.close(sandbox)  # the opener's close finds nothing left, and is fine
    with pytest.raises(SessionNotFound):
        await other.attach(sid)
