"""Sandbox Pods end at their lifetime with no corral process left: the harness was SIGKILLed."""

from __future__ import annotations

import secrets
import sys
import time
from typing import Any

import anyio
import pytest

from corral.core.labels import EXPIRES_AT, OWNER
from tests.integration.abandoned_harness import ROOT, kill_harness
from tests.integration.conftest import wait_for
from tests.integration.k8s.conftest import TEST_IMAGE, env_config, kubeconfig

LIFETIME_S = 8
#: How long past its expires-at label a Pod may take to have ended.
MARGIN_S = 6


def owned(cluster: Any, namespace: str, owner: str) -> tuple[dict[str, Any], set[str]]:
    """`owner`'s Pods by name, and its NetworkPolicies' names."""
    selector = f"{OWNER}={owner}"
    pods: Any = cluster.core.list_namespaced_pod(namespace, label_selector=selector)
    policies: Any = cluster.networking.list_namespaced_network_policy(
        namespace, label_selector=selector
    )
    return {p.metadata.name: p for p in pods.items}, {p.metadata.name for p in policies.items}


@pytest.mark.anyio
async def test_pods_of_a_killed_harness_end_themselves(cluster: Any, namespace: str) -> None:
    owner = f"corral-test-{secrets.token_hex(4)}"
    config = env_config(namespace, owner=owner, default_lifetime_s=LIFETIME_S)
    ids, killed_at = await anyio.to_thread.run_sync(kill_harness, "k8s", config, TEST_IMAGE, 2)

    names = {f"corral-{sid}" for sid in ids}
    pods, policies = owned(cluster, namespace, owner)
    assert {name: pod.status.phase for name, pod in pods.items()} == dict.fromkeys(names, "Running")
    assert policies == names
    expires = max(int(pod.metadata.labels[EXPIRES_AT]) for pod in pods.values())

    def ended() -> bool:
        return all(p.status.phase == "Failed" for p in owned(cluster, namespace, owner)[0].values())

    await wait_for(ended, expires + MARGIN_S)
    print(f"harness killed -> Pods ended: {time.monotonic() - killed_at:.1f} s")
    pods, policies = owned(cluster, namespace, owner)
    assert {pod.status.reason for pod in pods.values()} == {"DeadlineExceeded"}
    # An ended Pod and its NetworkPolicy stay until deleted: `corral gc` does it.
    assert set(pods) == names and policies == names
    argv = [sys.executable, "-m", "corral", "gc", "--env", "k8s"]
    for param in (f"kubeconfig={kubeconfig()}", f"namespace={namespace}", f"owner={owner}"):
        argv += ["-p", param]
    gc = await anyio.run_process(argv, cwd=ROOT)
    for name in names:
        assert f"removed pod {name}" in gc.stdout.decode(), gc.stdout
    await wait_for(lambda: owned(cluster, namespace, owner) == ({}, set()), time.time() + 30)
