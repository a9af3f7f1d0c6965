"""NetworkPolicy objects for a session, and the probe that checks the CNI enforces them.

Many CNIs do not enforce NetworkPolicy, or fail open (kind's kindnetd does). So after
every apply a destination the policy forbids is dialled from the Pod's `corral-probe`
container until it is refused; if it still answers after `verify_timeout_s`, the policy
is not enforced. Hostnames are resolved from that container too, by corral's own DNS
queries to the resolvers corral chose, after the harness's `host_aliases`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
from kubernetes.client.exceptions import ApiException

from corral.errors import NetworkPolicyNotEnforced, ProviderError
from corral.network.dns import Answer, resolve_names
from corral.network.netpol import render_network_policy
from corral.network.policy import NetworkPolicy
from corral.network.probe import forbidden_probe
from corral.network.resolve import Resolution, resolve_policy
from corral.network.targets import EntryType, IPAddress
from corral.providers.k8s import probe
from corral.providers.k8s.api import call, explain, idempotent
from corral.providers.k8s.execution import Target


async def resolve(
    prober: Target,
    policy: NetworkPolicy,
    servers: Sequence[IPAddress],
    static: Mapping[str, str],
) -> Resolution:
    """Resolve the policy's hostnames from the probe container (none: no exec at all)."""
    hosts = [t.host for t in policy.targets if t.entry_type is EntryType.HOSTNAME]
    answers: dict[str, Answer] = {}
    if hosts:

        async def run(argv: list[str], stdin: bytes) -> str:
            return await probe.run(prober, argv, stdin)

        try:
            answers = await resolve_names(hosts, servers=servers, run=run, static=static)
        except ValueError as exc:
            raise ProviderError(f"resolving the hosts of {policy}: {exc}") from None

    async def lookup(host: str) -> tuple[IPAddress, ...]:
        found = answers.get(host)
        return found.addresses if found else ()

    return await resolve_policy(policy, lookup, servers)


def render(
    policy: NetworkPolicy, resolved: Resolution, name: str, session_id: str, labels: dict[str, str]
) -> dict[str, Any]:
    return render_network_policy(
        policy, resolved, {"corral.session": session_id}, name=name, labels=labels
    )


async def create(clients: Any, tokens: int, namespace: str, body: dict[str, Any]) -> Any:
    try:
        return await call(
            tokens, clients.networking.create_namespaced_network_policy, namespace, body
        )
    except ApiException as exc:
        name = body["metadata"]["name"]
        raise ProviderError(f"creating NetworkPolicy {name}: {explain(exc)}") from None


async def replace_spec(
    clients: Any, tokens: int, namespace: str, name: str, body: dict[str, Any]
) -> None:
    """Switch by patching the one object: the CNI never sees it absent."""
    patch = {"spec": body["spec"]}
    try:
        await idempotent(
            tokens, clients.networking.patch_namespaced_network_policy, name, namespace, patch
        )
    except ApiException as exc:
        raise ProviderError(f"patching NetworkPolicy {name}: {explain(exc)}") from None


async def verify(
    prober: Target,
    policy: NetworkPolicy,
    resolved: Resolution,
    candidates: list[tuple[IPAddress, int]],
    timeout_s: float,
) -> float:
    """Dial a forbidden destination until refused; returns seconds until enforced."""
    forbidden = forbidden_probe(policy, resolved, candidates)
    if forbidden is None:
        return 0.0
    host, port = forbidden
    started = time.monotonic()
    deadline = started + timeout_s
    while await probe.dial(prober, str(host), port):
        if time.monotonic() > deadline:
            raise NetworkPolicyNotEnforced(
                f"{host}:{port}, which {policy} forbids, still answered {timeout_s:.0f} s "
                "after the NetworkPolicy was applied; the cluster's CNI does not enforce "
                "NetworkPolicy (or fails open)"
            )
        await anyio.sleep(0.25)
    return time.monotonic() - started
