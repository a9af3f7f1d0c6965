"""Fixtures for the Kubernetes integration tests: any reachable cluster (the one
tests/integration/cluster/ builds, or kind), a namespace per test run, real targets."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest
from kubernetes.client.exceptions import ApiException

from corral.providers.k8s import KubernetesConfig, KubernetesEnvironment
from corral.providers.k8s.api import connect, status_of
from tests.integration.conftest import made, unavailable

DEFAULT_KUBECONFIG = "/var/lib/corral-cluster/admin.kubeconfig"
TEST_IMAGE = os.environ.get("CORRAL_K8S_TEST_IMAGE", "corral.local/test:bookworm")
PROBE_IMAGE = os.environ.get("CORRAL_K8S_PROBE_IMAGE", "corral.local/holder:bookworm")


def kubeconfig() -> str:
    return os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG


@pytest.fixture(scope="session")
def cluster() -> Iterator[Any]:
    path = kubeconfig()
    if not Path(path).exists():
        unavailable(
            f"no kubeconfig at {path}; start a cluster with "
            "`bash tests/integration/cluster/up.sh` (or point KUBECONFIG at kind)"
        )
    clients: Any = connect(KubernetesConfig(kubeconfig=path))
    try:
        nodes: Any = clients.core.list_node(_request_timeout=(3, 10))
    except Exception as exc:
        unavailable(f"the cluster in {path} does not answer ({exc}); run cluster/up.sh")
        raise
    items: list[Any] = nodes.items
    conditions: list[Any] = []
    for node in items:
        conditions.extend(node.status.conditions or [])
    if not any(c.type == "Ready" and c.status == "True" for c in conditions):
        unavailable(f"no Ready node in the cluster of {path}")
    yield clients


@pytest.fixture(scope="session")
def namespace(cluster: Any) -> Iterator[str]:
    """A namespace for this run; every corral object in it must be gone at the end."""
    name = f"corral-test-{secrets.token_hex(3)}"
    yield name
    owner_selector = "corral.owner"
    pods: Any = cluster.core.list_namespaced_pod(name, label_selector=owner_selector)
    policies: Any = cluster.networking.list_namespaced_network_policy(
        name, label_selector=owner_selector
    )
    leaked = [p.metadata.name for p in pods.items] + [p.metadata.name for p in policies.items]
    cluster.core.delete_namespace(name)
    assert leaked == [], f"corral objects left in {name}: {leaked}"


def ensure_namespace(cluster: Any, name: str) -> None:
    """The run's namespace, for objects a test makes before any session did."""
    try:
        cluster.core.create_namespace({"metadata": {"name": name}})
    except ApiException as exc:
        if status_of(exc) != 409:
            raise


def env_config(namespace: str, **overrides: Any) -> dict[str, Any]:
    """The test config of a `k8s` environment, as JSON-ready parameters."""
    return {
        "kubeconfig": kubeconfig(),
        "namespace": namespace,
        "create_namespace": True,
        "image_pull_policy": "Never",
        "probe_image": PROBE_IMAGE,
        **overrides,
    }


def make_env(namespace: str, **overrides: Any) -> KubernetesEnvironment:
    return made(
        KubernetesEnvironment(KubernetesConfig.model_validate(env_config(namespace, **overrides)))
    )


@pytest.fixture
def k8s_env(namespace: str) -> KubernetesEnvironment:
    return make_env(namespace)


#: The runtimes the enforcement tests run under, by the RuntimeClass selecting each (None:
#: the node's default, runc). gVisor's Pods have their own network stack, whose packets
#: must still meet the CNI's NetworkPolicy rules on the Pod's veth.
RUNTIME_CLASSES: dict[str, str | None] = {"runc": None, "gvisor": "gvisor"}


@pytest.fixture(scope="session")
def runtime_classes(cluster: Any) -> dict[str, str | None]:
    """RUNTIME_CLASSES, once each named RuntimeClass is seen in the cluster."""
    with k8s.ApiClient(cluster.configuration) as client:
        node = k8s.NodeV1Api(client)
        for name in filter(None, RUNTIME_CLASSES.values()):
            try:
                node.read_runtime_class(name, _request_timeout=(3, 10))
            except ApiException as exc:
                if status_of(exc) != 404:
                    raise
                unavailable(
                    f"the cluster has no RuntimeClass {name!r}; "
                    "tests/integration/cluster/up.sh registers gVisor's as `gvisor`"
                )
    return RUNTIME_CLASSES


@pytest.fixture(params=list(RUNTIME_CLASSES))
def runtime_env(
    request: pytest.FixtureRequest, namespace: str, runtime_classes: dict[str, str | None]
) -> KubernetesEnvironment:
    """A `k8s` environment whose Pods run under each runtime in turn."""
    return make_env(namespace, runtime_class_name=runtime_classes[request.param])


@pytest.fixture
def plain_server(cluster: Any, namespace: str) -> Iterator[str]:
    """A Pod of the test's own, not corral's (no policy selects it), listening on 9000;
    yields its address. Sandboxes themselves accept no connections from other Pods."""
    name = f"plain-server-{secrets.token_hex(3)}"
    body = {
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "server",
                    "image": TEST_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "exec nc -lk -p 9000 >/dev/null"],
                }
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }
    ensure_namespace(cluster, namespace)
    cluster.core.create_namespaced_pod(namespace, body)
    try:
        deadline = time.monotonic() + 60
        pod: Any = cluster.core.read_namespaced_pod(name, namespace)
        while pod.status.phase != "Running" or not pod.status.pod_ip:
            assert time.monotonic() < deadline, f"{name} did not start: {pod.status}"
            time.sleep(0.2)
            pod = cluster.core.read_namespaced_pod(name, namespace)
        yield pod.status.pod_ip
    finally:
        cluster.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
