"""The pure parts of reattach and snapshots on `k8s`: the policy annotation, the "opened"
test, snapshot paths in the config, and the host-side snapshot store."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from corral.core.treelimits import TreeLimits
from corral.errors import ConfigError, ProviderError
from corral.network.policy import NetworkPolicy
from corral.network.resolve import Resolution
from corral.providers.k8s import enforcement
from corral.providers.k8s.config import KubernetesConfig
from corral.providers.k8s.pod import OPENED, opened
from corral.providers.k8s.snapshots import METADATA, SnapshotStore


def _object(annotations: dict[str, str] | None) -> Any:
    return SimpleNamespace(metadata=SimpleNamespace(name="corral-x", annotations=annotations))


def test_the_policy_annotation_is_written_with_the_spec_and_read_back() -> None:
    policy = NetworkPolicy.allowlist("10.0.0.0/8", "192.0.2.1:443")
    body = enforcement.render(policy, Resolution(), "corral-x", "x", {})
    assert len(body["spec"]["egress"]) == 2
    found = _object(body["metadata"]["annotations"])
    assert enforcement.policy_in_force(found) == policy


@pytest.mark.parametrize(
    ("annotations", "match"),
    [
        (None, "carries no corral.policy"),
        ({"corral.policy": "public"}, "is not a policy"),
        ({"corral.policy": '{"network_mode": "allowlist"}'}, "is not a policy"),
    ],
)
def test_a_missing_or_garbled_policy_is_refused(
    annotations: dict[str, str] | None, match: str
) -> None:
    with pytest.raises(ProviderError, match=f"corral-x.*{match}"):
        enforcement.policy_in_force(_object(annotations))


def _pod(*, phase: str = "Running", ready: bool = True, mark: bool = True) -> Any:
    statuses = [
        SimpleNamespace(name=n, ready=ready, state=SimpleNamespace(running=True))
        for n in ("sandbox", "corral-probe")
    ]
    return SimpleNamespace(
        metadata=SimpleNamespace(
            annotations={OPENED: "true"} if mark else {}, deletion_timestamp=None
        ),
        status=SimpleNamespace(phase=phase, container_statuses=statuses),
        spec=SimpleNamespace(containers=[object(), object()]),
    )


def test_only_a_running_ready_pod_its_open_finished_is_opened() -> None:
    assert opened(_pod())
    assert not opened(_pod(mark=False))
    assert not opened(_pod(ready=False))
    assert not opened(_pod(phase="Failed"))
    deleting = _pod()
    deleting.metadata.deletion_timestamp = datetime.now(UTC)
    assert not opened(deleting)


@pytest.mark.parametrize("path", ["work", "/", "//", "/a/../b", ""])
def test_snapshot_paths_must_be_absolute_directories_below_the_root(path: str) -> None:
    with pytest.raises(ValidationError, match="snapshot path"):
        KubernetesConfig(snapshot_paths=(path,))


def test_snapshot_paths_are_normalized() -> None:
    assert KubernetesConfig(snapshot_paths=("//srv/./data/",)).snapshot_paths == ("/srv/data",)


def _store(root: Path, owner: str = "me", lifetime_s: float = 60.0) -> SnapshotStore:
    return SnapshotStore(root, owner=owner, lifetime_s=lifetime_s, limits=TreeLimits(), paths=None)


def test_a_snapshot_loads_until_it_expires_then_gc_takes_only_it(tmp_path: Path) -> None:
    store = _store(tmp_path)
    record = store.begin("sess", ("/work",))
    store.tree(record.id, 0).mkdir(parents=True)
    assert store.load(record.ref()) == record
    assert (tmp_path / record.id).stat().st_mode & 0o077 == 0
    metadata = json.loads((tmp_path / record.id / METADATA).read_text())
    assert set(metadata) == {
        "provider", "owner", "id", "source_session", "created_at", "expires_at", "paths"
    }  # fmt: skip
    theirs = _store(tmp_path, owner="them").begin("other", ("/work",))
    (tmp_path / "snap-ffffffffffffffff").mkdir()  # no metadata: not corral's to remove
    later = datetime.now(UTC) + timedelta(seconds=61)
    assert store.collect(later) == [f"snapshot {record.id}"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([theirs.id, "snap-ffffffffffffffff"])


def test_expired_missing_incomplete_and_forged_refs_are_refused(tmp_path: Path) -> None:
    store = _store(tmp_path, lifetime_s=0.001)
    record = store.begin("sess", ("/work",))
    store.tree(record.id, 0).mkdir(parents=True)
    time.sleep(0.01)
    with pytest.raises(ConfigError, match=f"{record.id}.*expired"):
        store.load(record.ref())
    fresh = _store(tmp_path)
    incomplete = fresh.begin("sess", ("/a", "/b"))
    fresh.tree(incomplete.id, 0).mkdir(parents=True)
    with pytest.raises(ConfigError, match="incomplete"):
        fresh.load(incomplete.ref())
    forged = incomplete.ref().model_copy(update={"id": "../../etc"})
    with pytest.raises(ConfigError, match="'../../etc'"):
        fresh.load(forged)
    with pytest.raises(ConfigError, match="owner 'them'"):
        _store(tmp_path, owner="them").load(incomplete.ref())


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories anyway")
def test_read_only_saved_trees_are_still_removed(tmp_path: Path) -> None:
    store = _store(tmp_path)
    record = store.begin("sess", ("/work",))
    locked = store.tree(record.id, 0) / "locked"
    locked.mkdir(parents=True)
    (locked / "f").write_text("x")
    locked.chmod(0o500)
    store.discard(record.id)
    assert not (tmp_path / record.id).exists()


def test_the_default_snapshot_path_is_the_workdir_but_never_the_root(tmp_path: Path) -> None:
    assert _store(tmp_path).paths_for("/work") == ("/work",)
    with pytest.raises(ConfigError, match="snapshot_paths"):
        _store(tmp_path).paths_for("/")
