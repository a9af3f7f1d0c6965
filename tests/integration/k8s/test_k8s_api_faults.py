"""API server faults: a TLS proxy in front of the API server fails one call of an `open`,
or goes away while an exec runs.

For each distinct call an open makes (its first occurrence, and its last where it comes
twice; the Pod's status polls only at the first): answered with a 500, or its connection
dropped; for a few calls, stalled. Each open must succeed (a retried idempotent call) or
raise `ProviderError` naming the call, within its bounds, leaving no Pod or NetworkPolicy
behind (seen through the real API server); calls that create something are never sent
twice. `CORRAL_API_FAULTS_FULL=1` fails every call number of the open instead, as the
Docker test does (about 30 opens, several minutes on 2 cores).
"""

from __future__ import annotations

import os
import secrets
import time
from typing import Any

import anyio
import pytest

from corral import ExecutionPlan, NetworkPolicy, NetworkSchedule
from corral.core.plan import Timeouts
from corral.errors import ProviderError
from corral.providers.k8s.environment import KubernetesEnvironment
from corral.testing.api_faults import Action, ApiServerFaultProxy, Call
from corral.testing.leftovers import settled
from tests.integration.disrupt import exec_while
from tests.integration.k8s.conftest import TEST_IMAGE, ensure_namespace, kubeconfig, make_env

pytestmark = pytest.mark.anyio

PLAN = ExecutionPlan(
    image=TEST_IMAGE,
    network=NetworkSchedule(baseline=NetworkPolicy.no_network()),
    timeouts=Timeouts(startup_s=60),
)
API_TIMEOUT_S = 3.0
FULL = os.environ.get("CORRAL_API_FAULTS_FULL") == "1"
_NS = "/api/v1/namespaces/{ns}"
_NETPOL = "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies"
CREATE_POLICY = Call("POST", _NETPOL)
CREATE_POD = Call("POST", f"{_NS}/pods")
READ_POD = Call("GET", f"{_NS}/pods/{{name}}")
#: Creating calls: a retry after a lost answer could make a second one.
CREATES = {CREATE_POLICY, CREATE_POD}

Fault = tuple[Call | None, int]  # (the call, its occurrence), or (None, call number)


@pytest.fixture
def owner(cluster: Any, namespace: str) -> str:
    ensure_namespace(cluster, namespace)  # so that no open of this test creates it
    return f"api-faults-{secrets.token_hex(3)}"


def _env(namespace: str, owner: str, proxy: ApiServerFaultProxy) -> KubernetesEnvironment:
    return make_env(
        namespace, owner=owner, kubeconfig=proxy.kubeconfig, api_timeout_s=API_TIMEOUT_S
    )


def _proxy(**faults: Any) -> ApiServerFaultProxy:
    return ApiServerFaultProxy(upstream_kubeconfig=kubeconfig(), **faults)


async def _leftovers(cluster: Any, namespace: str, owner: str) -> list[str]:
    """This owner's Pods and NetworkPolicies, through the real API server."""

    def look() -> list[str]:
        selector = f"corral.owner={owner}"
        pods: Any = cluster.core.list_namespaced_pod(namespace, label_selector=selector)
        policies: Any = cluster.networking.list_namespaced_network_policy(
            namespace, label_selector=selector
        )
        return [f"pod {p.metadata.name}" for p in pods.items] + [
            f"networkpolicy {p.metadata.name}" for p in policies.items
        ]

    # A Pod deleted with no grace period can take a moment to leave the listing.
    return await settled(look, timeout=15)


async def _calls_of_an_open(namespace: str, owner: str) -> list[Call]:
    with _proxy() as proxy:
        env = _env(namespace, owner, proxy)
        session = await env.open(PLAN)
        calls = list(proxy.calls)
        await env.close(session)
    return calls


def _chosen(calls: list[Call]) -> list[Fault]:
    if FULL:
        return [(None, n) for n in range(1, len(calls) + 1)]
    faults: list[Fault] = []
    for call in dict.fromkeys(calls):
        count = calls.count(call)
        faults.append((call, 1))
        if count == 2:
            faults.append((call, 2))
    return faults


async def _fault_each(
    cluster: Any, namespace: str, owner: str, action: Action, faults: list[Fault]
) -> list[str]:
    """One open per fault, that call failed with `action`; a row per open."""
    rows: list[str] = []
    for call, n in faults:
        with _proxy(fault_on=call, fault_at=n, action=action) as proxy:
            env = _env(namespace, owner, proxy)
            started = time.monotonic()
            try:
                session = await env.open(PLAN)
            except ProviderError as exc:
                outcome = f"ProviderError: {exc}"
            else:
                outcome = "opened"
                await env.close(session)
            elapsed = time.monotonic() - started
            calls, hit = list(proxy.calls), proxy.faulted
        rows.append(f"{action:5} {hit} #{n} -> {outcome[:240]} ({elapsed:.1f} s)")
        assert hit is not None, f"the open never made call {call} #{n}: {calls}"
        assert await _leftovers(cluster, namespace, owner) == [], rows[-1]
        if outcome != "opened":
            # Named: the call in words (`create Pod corral-…`), or the exec that failed.
            assert "Kubernetes API call `" in outcome or "exec in Pod" in outcome, rows[-1]
        if hit in CREATES:
            assert calls.count(hit) == 1, f"{hit} was sent again: {rows[-1]}"
            assert outcome != "opened", f"a failed {hit} went unnoticed: {rows[-1]}"
        # Bounded: a stall ends at the per-call timeout, after at most a few retries.
        assert elapsed < 30 + 4 * API_TIMEOUT_S, rows[-1]
    return rows


@pytest.mark.parametrize("action", ["error", "drop"])
async def test_a_fault_at_any_call_of_open_is_clean(
    cluster: Any, namespace: str, owner: str, action: Action
) -> None:
    calls = await _calls_of_an_open(namespace, owner)
    assert {CREATE_POLICY, CREATE_POD, READ_POD} <= set(calls), calls
    rows = await _fault_each(cluster, namespace, owner, action, _chosen(calls))
    print("\n".join(rows))
    assert any("ProviderError" in row for row in rows)
    assert any("opened" in row for row in rows)  # some were retried through


async def test_a_stalled_call_ends_at_its_timeout(cluster: Any, namespace: str, owner: str) -> None:
    faults: list[Fault] = [(CREATE_POLICY, 1), (CREATE_POD, 1), (READ_POD, 1)]
    rows = await _fault_each(cluster, namespace, owner, "stall", faults)
    print("\n".join(rows))
    assert "create NetworkPolicy corral-" in rows[0] and "Timeout" in rows[0], rows[0]
    assert "create Pod corral-" in rows[1] and "Timeout" in rows[1], rows[1]
    assert "-> opened" in rows[2], rows[2]  # a read is retried


async def test_api_server_gone_mid_exec(cluster: Any, namespace: str, owner: str) -> None:
    with _proxy() as proxy:
        env = _env(namespace, owner, proxy)
        session = await env.open(PLAN)
        try:
            outcome, took = await exec_while(session, proxy.drop_all, after_s=1.5)
            print(f"{outcome} after {took:.1f} s")
            assert outcome.startswith("raised ProviderError: exec in Pod"), outcome
            assert took < 1.5 + 5, outcome
            with pytest.raises(ProviderError):  # still gone: a new call fails, promptly
                with anyio.fail_after(30):
                    await session.exec(["true"])
        finally:
            proxy.back()
            await env.close(session)
    assert await _leftovers(cluster, namespace, owner) == []


DELETE_POD = Call("DELETE", f"{_NS}/pods/{{name}}")
DELETE_POLICY = Call("DELETE", f"{_NETPOL}/{{name}}")
READS = {READ_POD, Call("GET", f"{_NETPOL}/{{name}}")}


async def test_a_close_deletes_what_its_open_made_by_uid_alone(
    cluster: Any, namespace: str, owner: str
) -> None:
    """A close sends one delete per object and reads neither first: the uids the creates
    answered name exactly what the open made (each delete's precondition). Half the calls
    of read-then-delete, which is what closing thousands at once queues behind."""
    with _proxy() as proxy:
        env = _env(namespace, owner, proxy)
        session = await env.open(PLAN)
        opened = len(proxy.calls)
        await env.close(session)
        closing = proxy.calls[opened:]
    assert closing.count(DELETE_POD) == closing.count(DELETE_POLICY) == 1, closing
    assert not READS & set(closing), closing
    assert await _leftovers(cluster, namespace, owner) == []


async def test_a_close_leaves_a_pod_of_the_same_name_it_did_not_make(
    cluster: Any, namespace: str, owner: str
) -> None:
    """Someone replaces the session's Pod with one of the same name, labels and open token:
    the close removes exactly what its open made, so the replacement stays."""
    env = make_env(namespace, owner=owner)
    session = await env.open(PLAN)
    name = f"corral-{session.id}"
    made: Any = cluster.core.read_namespaced_pod(name, namespace)
    cluster.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    assert await settled(lambda: _absent(cluster, namespace, name), timeout=30) == []
    meta = made.metadata
    other = {
        "metadata": {"name": name, "labels": meta.labels, "annotations": meta.annotations},
        "spec": {
            "containers": [{"name": "c", "image": TEST_IMAGE, "command": ["sleep", "60"]}],
            "terminationGracePeriodSeconds": 0,
        },
    }
    cluster.core.create_namespaced_pod(namespace, other)
    try:
        await env.close(session)
        kept: Any = cluster.core.read_namespaced_pod(name, namespace)
        assert kept.metadata.uid != meta.uid
    finally:
        cluster.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)


def _absent(cluster: Any, namespace: str, name: str) -> list[str]:
    """[name] while the Pod `name` is still listed, [] once it is gone."""
    pods: Any = cluster.core.list_namespaced_pod(namespace, field_selector=f"metadata.name={name}")
    return [name] if pods.items else []
