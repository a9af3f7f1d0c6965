"""The pure parts of the fault proxies: route patterns, which call a fault hits, and how
the k8s provider names a failed API call."""

from __future__ import annotations

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from corral.errors import ProviderError
from corral.providers.k8s.api import describe, failure, transient
from corral.testing.api_faults import route_pattern
from corral.testing.engine_faults import EngineFaultProxy
from corral.testing.fault_proxy import Call, FaultProxy


@pytest.mark.parametrize(
    ("path", "pattern"),
    [
        ("/api/v1/namespaces/corral-test-1/pods", "/api/v1/namespaces/{ns}/pods"),
        ("/api/v1/namespaces/ns/pods/corral-abc", "/api/v1/namespaces/{ns}/pods/{name}"),
        (
            "/api/v1/namespaces/ns/pods/p/exec?command=sh&container=sandbox",
            "/api/v1/namespaces/{ns}/pods/{name}/exec",
        ),
        (
            "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies/corral-x",
            "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/{name}",
        ),
        ("/api/v1/namespaces/corral", "/api/v1/namespaces/{name}"),
        ("/api/v1/namespaces/corral/status", "/api/v1/namespaces/{name}/status"),
        ("/api/v1/namespaces", "/api/v1/namespaces"),
        ("/api/v1/nodes/node-1", "/api/v1/nodes/{name}"),
        ("/api/v1/watch/namespaces/ns/pods", "/api/v1/watch/namespaces/{ns}/pods"),
        ("/version?timeout=32s", "/version"),
        ("/api", "/api"),
    ],
)
def test_route_pattern(path: str, pattern: str) -> None:
    assert route_pattern(path) == pattern


def test_the_docker_route_drops_version_and_query() -> None:
    assert EngineFaultProxy()._route("/v1.41/containers/create?name=x") == "/containers/create"  # pyright: ignore[reportPrivateUsage]


def test_a_fault_hits_the_nth_call_overall() -> None:
    proxy = FaultProxy(fault_at=2)
    hits = [proxy.record(Call("GET", f"/{i}")) for i in range(4)]
    assert hits == [False, True, False, False]
    assert proxy.faulted == Call("GET", "/1") and len(proxy.calls) == 4


def test_a_fault_hits_the_nth_matching_call() -> None:
    read = Call("GET", "/api/v1/namespaces/{ns}/pods/{name}")
    proxy = FaultProxy(fault_on=read, fault_at=2)
    calls = [Call("POST", "/api/v1/namespaces/{ns}/pods"), read, Call("PATCH", "/x"), read, read]
    assert [proxy.record(c) for c in calls] == [False, False, False, True, False]
    assert proxy.faulted == read


def test_no_fault_without_a_number() -> None:
    proxy = FaultProxy()
    assert not any(proxy.record(Call("GET", "/")) for _ in range(3))
    assert proxy.faulted is None


def create_namespaced_pod(namespace: str, body: object) -> None: ...
def read_namespaced_service(name: str, namespace: str) -> None: ...
def list_namespaced_network_policy(namespace: str) -> None: ...
def run_blocking_exec() -> None: ...


def test_a_call_is_named_in_words() -> None:
    assert describe(create_namespaced_pod, ["ns", {"metadata": {"name": "p"}}]) == "create Pod p"
    assert describe(read_namespaced_service, ["kube-dns", "kube-system"]) == (
        "read Service kube-dns"
    )
    assert describe(list_namespaced_network_policy, ["ns"]) == "list NetworkPolicy"
    assert describe(run_blocking_exec, []) == "run_blocking_exec"


def test_a_4xx_stays_the_callers_and_the_rest_is_a_named_provider_error() -> None:
    args = ["ns", {"metadata": {"name": "p"}}]
    conflict = ApiException(status=409, reason="Conflict")
    assert failure(create_namespaced_pod, args, conflict) is conflict
    for exc in (
        ApiException(status=500, reason="boom"),
        ApiException(status=429, reason="slow down"),
        urllib3.exceptions.ProtocolError("Connection aborted."),
        TimeoutError("timed out"),
    ):
        error = failure(create_namespaced_pod, args, exc)
        assert isinstance(error, ProviderError)
        assert "`create Pod p` failed" in str(error)


def test_what_is_transient() -> None:
    pool: urllib3.HTTPConnectionPool = urllib3.HTTPConnectionPool("127.0.0.1")
    timeout = urllib3.exceptions.ReadTimeoutError(pool, "/", "read timed out")
    assert transient(timeout)
    assert transient(urllib3.exceptions.MaxRetryError(pool, "/", timeout))
    assert transient(ApiException(status=503))
    assert transient(ConnectionRefusedError())
    assert not transient(ApiException(status=404))
    assert not transient(ValueError("bad"))
