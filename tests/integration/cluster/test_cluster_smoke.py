# pyright: basic
"""Smoke test of a real Kubernetes cluster: pods run, exec works, NetworkPolicy is enforced.

Runs against whatever cluster ``KUBECONFIG`` points at (default: the one
``tests/integration/cluster/up.sh`` writes to /var/lib/corral-cluster/admin.kubeconfig).
The images default to the ones up.sh imports; with another cluster (e.g. kind) set
``CORRAL_TEST_IMAGE`` to an image with busybox (sh, nc, sleep, timeout).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

kubernetes = pytest.importorskip("kubernetes")

from kubernetes import client, config  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402
from kubernetes.stream import stream  # noqa: E402

pytestmark = pytest.mark.k8s

DEFAULT_KUBECONFIG = "/var/lib/corral-cluster/admin.kubeconfig"
TEST_IMAGE = os.environ.get("CORRAL_TEST_IMAGE", "corral.local/test:busybox")
PULL_POLICY = os.environ.get("CORRAL_TEST_IMAGE_PULL_POLICY", "IfNotPresent")
SERVER_PORT = 8080
# kube-router (and other enforcers) apply a policy change within a few seconds.
POLICY_DEADLINE_S = 60.0


def _no_cluster(reason: str) -> None:
    message = f"{reason}; start one with `bash tests/integration/cluster/up.sh`"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"no Kubernetes cluster reachable in CI: {message}")
    pytest.skip(f"no Kubernetes cluster reachable: {message}")


@pytest.fixture(scope="module")
def api_client() -> Iterator[Any]:
    kubeconfig = os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    if not Path(kubeconfig.split(os.pathsep)[0]).is_file():
        _no_cluster(f"kubeconfig {kubeconfig} not found")
    try:
        api = config.new_client_from_config(config_file=kubeconfig)
        client.VersionApi(api).get_code(_request_timeout=10)
    except Exception as exc:  # any failure to talk to the API server means "no cluster"
        _no_cluster(f"{type(exc).__name__}: {exc}")
    yield api
    api.close()


@pytest.fixture(scope="module")
def core(api_client: Any) -> Any:
    return client.CoreV1Api(api_client)


@pytest.fixture(scope="module")
def namespace(api_client: Any, core: Any) -> Iterator[str]:
    name = f"corral-smoke-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        # Pods are admitted only once the controller manager made the default account.
        _wait(lambda: _exists(lambda: core.read_namespaced_service_account("default", name)), 60)
        yield name
    finally:
        core.delete_namespace(name, grace_period_seconds=0)


def _exists(read: Callable[[], Any]) -> bool:
    try:
        read()
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _wait(predicate: Callable[[], bool], timeout: float, interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout}s")
        time.sleep(interval)


def _pod(name: str, labels: dict[str, str], command: list[str]) -> Any:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(
                    name="main",
                    image=TEST_IMAGE,
                    image_pull_policy=PULL_POLICY,
                    command=command,
                )
            ],
            restart_policy="Never",
            termination_grace_period_seconds=1,
            automount_service_account_token=False,
        ),
    )


def _run_pod(core: Any, namespace: str, pod: Any, timeout: float = 120) -> Any:
    core.create_namespaced_pod(namespace, pod)
    name = pod.metadata.name
    state: dict[str, Any] = {}

    def running() -> bool:
        current = core.read_namespaced_pod(name, namespace)
        state["pod"] = current
        if current.status.phase in ("Failed", "Succeeded"):
            raise AssertionError(f"pod {name} ended: {current.status}")
        return current.status.phase == "Running" and bool(current.status.pod_ip)

    try:
        _wait(running, timeout)
    except TimeoutError:
        events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
        details = [f"{e.reason}: {e.message}" for e in events.items]
        raise AssertionError(f"pod {name} not running: {state.get('pod')}\n{details}") from None
    return state["pod"]


def _exec(core: Any, namespace: str, pod: str, command: list[str]) -> tuple[int, str, str]:
    resp = stream(
        core.connect_get_namespaced_pod_exec,
        pod,
        namespace,
        command=command,
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
        _preload_content=False,
    )
    try:
        resp.run_forever(timeout=60)
        out, err = resp.read_stdout(), resp.read_stderr()
        rc = resp.returncode
    finally:
        resp.close()
    assert rc is not None, f"exec {command} in {pod} did not finish"
    return rc, out, err


@pytest.fixture(scope="module")
def client_pod(core: Any, namespace: str) -> Any:
    return _run_pod(core, namespace, _pod("client", {"app": "client"}, ["sleep", "3600"]))


@pytest.fixture(scope="module")
def server_pod(core: Any, namespace: str) -> Any:
    # busybox nc: -ll with -e keeps listening and answers every connection with "hi".
    command = ["nc", "-ll", "-p", str(SERVER_PORT), "-e", "echo", "hi"]
    return _run_pod(core, namespace, _pod("server", {"app": "server"}, command))


def test_pod_runs_and_exec_works(core: Any, namespace: str, client_pod: Any) -> None:
    assert client_pod.status.phase == "Running"
    rc, out, err = _exec(core, namespace, "client", ["sh", "-c", "echo out-$((6*7)); echo e >&2"])
    assert (rc, out, err) == (0, "out-42\n", "e\n")
    rc, _, _ = _exec(core, namespace, "client", ["sh", "-c", "exit 3"])
    assert rc == 3


def _connects(core: Any, namespace: str, server_ip: str) -> bool:
    rc, out, _ = _exec(
        core,
        namespace,
        "client",
        ["timeout", "5", "nc", "-w", "3", server_ip, str(SERVER_PORT)],
    )
    return rc == 0 and out.strip() == "hi"


def _deny_policy(name: str, app: str, policy_type: str) -> Any:
    return client.V1NetworkPolicy(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1NetworkPolicySpec(
            pod_selector=client.V1LabelSelector(match_labels={"app": app}),
            policy_types=[policy_type],
        ),
    )


@pytest.mark.parametrize(
    ("app", "policy_type"),
    [("client", "Egress"), ("server", "Ingress")],
    ids=["deny-egress-on-client", "deny-ingress-on-server"],
)
def test_network_policy_blocks_then_allows(
    api_client: Any,
    core: Any,
    namespace: str,
    client_pod: Any,
    server_pod: Any,
    app: str,
    policy_type: str,
) -> None:
    net = client.NetworkingV1Api(api_client)
    server_ip = server_pod.status.pod_ip
    name = f"deny-{policy_type.lower()}"

    # Before: the client reaches the server.
    _wait(lambda: _connects(core, namespace, server_ip), 30, interval=1)

    # With a deny-all policy: the connection fails.
    net.create_namespaced_network_policy(namespace, _deny_policy(name, app, policy_type))
    try:
        _wait(lambda: not _connects(core, namespace, server_ip), POLICY_DEADLINE_S, interval=1)
        # ... and keeps failing (not a one-off glitch).
        assert not _connects(core, namespace, server_ip)
    finally:
        net.delete_namespaced_network_policy(name, namespace)

    # After deleting it: the connection works again.
    _wait(lambda: _connects(core, namespace, server_ip), POLICY_DEADLINE_S, interval=1)
