"""The pure parts of reattach and snapshots on `k8s`: the policy annotation, the "opened"
test, and snapshot paths (the host-side store is tested in test_snapshot_store.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from corral.errors import ConfigError, ExecUserUnsupported, ProviderError
from corral.network.policy import NetworkPolicy
from corral.network.resolve import Resolution
from corral.providers.k8s import enforcement
from corral.providers.k8s.config import KubernetesConfig
from corral.providers.k8s.environment import run_as_of
from corral.providers.k8s.objects import Objects
from corral.providers.k8s.pod import OPENED, opened
from corral.providers.k8s.session import own_user, saved_paths


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


def test_the_default_snapshot_path_is_the_workdir_but_never_the_root() -> None:
    assert saved_paths(None, "/work") == ("/work",)
    assert saved_paths(("/a", "/b"), "/") == ("/a", "/b")
    with pytest.raises(ConfigError, match="snapshot_paths"):
        saved_paths(None, "/")


@pytest.mark.anyio
async def test_a_refused_list_is_one_line_naming_the_namespace() -> None:
    def list_namespaced_pod(namespace: str, **kwargs: Any) -> Any:
        raise ApiException(status=403, reason="Forbidden")

    clients: Any = SimpleNamespace(
        tokens=1, core=SimpleNamespace(list_namespaced_pod=list_namespaced_pod)
    )
    objects = Objects(clients, "corral", "inspect")
    with pytest.raises(ProviderError) as raised:
        await objects.listed("pod", "corral.owner=inspect")
    assert str(raised.value) == "listing pods in namespace 'corral' was refused: 403 Forbidden"


def _uids(container_uid: int | None, pod_uid: int | None) -> tuple[Any, Any]:
    container = SimpleNamespace(security_context=SimpleNamespace(run_as_user=container_uid))
    pod = SimpleNamespace(
        spec=SimpleNamespace(security_context=SimpleNamespace(run_as_user=pod_uid))
    )
    return pod, container


def test_a_user_the_pod_runs_as_is_taken_and_any_other_refused_with_advice_that_works() -> None:
    # What Harbor asks of its agent and verifier on a Pod configured with run_as_user: 0.
    pod, container = _uids(0, None)
    uid = run_as_of(pod, container)
    assert uid == 0
    own_user("root", uid)
    own_user("0", uid)
    own_user(None, uid)
    own_user("1000", 1000)
    assert run_as_of(*_uids(None, 1000)) == 1000
    assert run_as_of(*_uids(2000, 1000)) == 2000
    with pytest.raises(ExecUserUnsupported, match="this Pod runs as uid 0; set run_as_user"):
        own_user("agent", uid)
    with pytest.raises(ExecUserUnsupported, match="runs as uid 1000"):
        own_user("root", 1000)
    with pytest.raises(ExecUserUnsupported, match=r"image's user \(run_as_user unset\)"):
        own_user("root", run_as_of(*_uids(None, None)))
