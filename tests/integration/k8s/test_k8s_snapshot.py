"""save() and fork() on the `k8s` provider: files come back, processes and policy do not,
snapshots expire and gc removes them, nothing is left on the cluster."""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import SecretStr

from corral import ConfigError, ExecutionPlan, NetworkPolicy, NetworkSchedule, SnapshotRef
from corral.providers.k8s import KubernetesEnvironment
from tests.integration.conftest import ALLOWED_IP, wait_for
from tests.integration.k8s.conftest import TEST_IMAGE, make_env

pytestmark = pytest.mark.anyio

SECRET = "s3cret-" + secrets.token_hex(4)


def plan(policy: str) -> ExecutionPlan:
    return ExecutionPlan(
        image=TEST_IMAGE,
        workdir="/work",
        env={"API_TOKEN": SecretStr(SECRET)},
        network=NetworkSchedule.model_validate({"baseline": policy}),
    )


def objects(cluster: Any, namespace: str, owner: str) -> list[str]:
    selector = f"corral.owner={owner}"
    pods: Any = cluster.core.list_namespaced_pod(namespace, label_selector=selector)
    nps: Any = cluster.networking.list_namespaced_network_policy(namespace, label_selector=selector)
    return [p.metadata.name for p in pods.items] + [p.metadata.name for p in nps.items]


async def gone(cluster: Any, namespace: str, owner: str) -> None:
    await wait_for(lambda: objects(cluster, namespace, owner) == [], time.time() + 60)


def snapshot_env(namespace: str, store: Path, owner: str, **extra: Any) -> KubernetesEnvironment:
    return make_env(namespace, owner=owner, snapshot_dir=str(store), **extra)


async def sleepers(sandbox: Any) -> list[str]:
    listed = await sandbox.exec(["ps", "-eo", "args"])
    return [line for line in listed.stdout.splitlines() if line.startswith("sleep 1000")]


async def test_a_fork_has_the_files_not_the_processes_nor_the_policy(
    cluster: Any, namespace: str, tmp_path: Path
) -> None:
    owner = f"corral-test-{secrets.token_hex(4)}"
    env = snapshot_env(namespace, tmp_path, owner)
    parent = await env.open(plan("public"))
    fork = None
    try:
        await parent.exec("mkdir -p /work/data && echo kept > /work/data/file.txt")
        await parent.exec("setsid nohup sleep 1000 >/dev/null 2>&1 &")
        assert await sleepers(parent), "the parent's detached sleep must be running"
        await parent.set_network_policy(NetworkPolicy.allowlist(f"{ALLOWED_IP}:80"))
        ref = await parent.save()
        assert (ref.provider, ref.source_session) == ("k8s", parent.id)
        assert ref.expires_at - ref.created_at == timedelta(seconds=86400)

        fork = await env.fork(ref, plan("no-network"))
        assert fork.id != parent.id
        assert await fork.read_text("/work/data/file.txt") == "kept\n"
        assert await sleepers(fork) == []
        assert fork.policy == NetworkPolicy.no_network()
        policies: Any = cluster.networking.list_namespaced_network_policy(
            namespace, label_selector=f"corral.session={fork.id}"
        )
        (enforced,) = policies.items
        assert enforced.spec.egress in (None, []), "the fork runs under its plan's baseline"
        assert await sleepers(parent), "saving and forking left the parent as it was"
        # What corral keeps on this host names the snapshot, never the plan's secrets.
        kept = b"".join(p.read_bytes() for p in (tmp_path / ref.id).glob("*.json"))
        assert ref.id.encode() in kept and SECRET.encode() not in kept
    finally:
        for session in (fork, parent):
            if session is not None:
                await env.close(session)
    await gone(cluster, namespace, owner)


async def test_expired_and_unknown_snapshots_are_refused_and_gc_removes_them(
    cluster: Any, namespace: str, tmp_path: Path
) -> None:
    owner = f"corral-test-{secrets.token_hex(4)}"
    env = snapshot_env(namespace, tmp_path, owner, snapshot_lifetime_s=1)
    other_owner = snapshot_env(namespace, tmp_path, f"{owner}-other")
    stranger = tmp_path / "not-corral"
    stranger.mkdir()
    parent = await env.open(plan("public"))
    try:
        await parent.write_text("/work/x", "x")
        ref = await parent.save()
    finally:
        await env.close(parent)
    await anyio.sleep(1.1)
    with pytest.raises(ConfigError, match=f"{ref.id}.*expired"):
        await env.fork(ref, plan("public"))
    fabricated = SnapshotRef(
        provider="k8s",
        id="snap-0123456789abcdef",
        created_at=datetime.now(UTC),
        source_session="nobody",
        expires_at=datetime.now(UTC) + timedelta(hours=1),
    )
    with pytest.raises(ConfigError, match="snap-0123456789abcdef"):
        await env.fork(fabricated, plan("public"))
    assert (tmp_path / ref.id).is_dir()
    with pytest.raises(ConfigError, match=f"{ref.id}.*left alone"):
        await other_owner.discard_snapshot(ref)
    assert await other_owner.gc() == [], "another owner's gc leaves the snapshot"
    removed = await env.gc()
    assert f"snapshot {ref.id}" in removed
    assert not (tmp_path / ref.id).exists() and stranger.is_dir()
    await gone(cluster, namespace, owner)


async def test_a_discarded_snapshot_is_gone_and_its_fork_keeps_running(
    cluster: Any, namespace: str, tmp_path: Path
) -> None:
    owner = f"corral-test-{secrets.token_hex(4)}"
    env = snapshot_env(namespace, tmp_path, owner)
    async with env.session(plan("public")) as parent:
        await parent.write_text("/work/x", "x")
        ref = await parent.save()
    fork = await env.fork(ref, plan("public"))
    try:
        await env.discard_snapshot(ref)
        assert not (tmp_path / ref.id).exists()
        assert await fork.read_text("/work/x") == "x"
    finally:
        await env.close(fork)
    await env.discard_snapshot(ref)  # gone is no error
    with pytest.raises(ConfigError, match=ref.id):
        await env.fork(ref, plan("public"))
    await gone(cluster, namespace, owner)
