"""NetworkPolicy objects for a session, and the probe that checks the CNI enforces them.

Many CNIs do not enforce NetworkPolicy, or fail open (kind's kindnetd does). So after
every apply a destination the policy forbids is dialled from inside the Pod until it is
refused; if it still answers after `verify_timeout_s`, the policy is not enforced.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
from kubernetes.client.exceptions import ApiException

from corral.core.output import DEFAULT_OUTPUT_LIMIT
from corral.errors import NetworkPolicyNotEnforced, ProviderError
from corral.network.netpol import render_network_policy
from corral.network.policy import NetworkPolicy
from corral.network.probe import forbidden_probe
from corral.network.resolve import GETENT_SCRIPT, Resolution, parse_getent, resolve_policy
from corral.network.targets import EntryType, IPAddress
from corral.providers.k8s.api import call, explain, idempotent
from corral.providers.k8s.execution import Target, run_exec

_DIAL = 'nc -w 2 "$1" "$2" </dev/null >/dev/null 2>&1 && echo connected || echo refused'


async def sandbox_exec(target: Target, argv: list[str], timeout: float) -> str:
    result = await run_exec(
        target,
        argv,
        cwd=None,
        env={},
        stdin=None,
        timeout=timeout,
        on_output=None,
        output_limit=DEFAULT_OUTPUT_LIMIT,
    )
    return result.stdout


async def resolve(
    target: Target | None, policy: NetworkPolicy, dns: tuple[IPAddress, ...]
) -> Resolution:
    """Resolve the policy's hostnames inside the Pod (none to resolve: no exec at all)."""
    hosts = [t.host for t in policy.targets if t.entry_type is EntryType.HOSTNAME]
    answers: dict[str, list[IPAddress]] = {}
    if hosts:
        if target is None:
            raise ProviderError("hostnames can only be resolved inside a running Pod")
        answers = parse_getent(
            await sandbox_exec(target, ["sh", "-c", GETENT_SCRIPT, "sh", *hosts], 30)
        )

    async def lookup(host: str) -> list[IPAddress]:
        return answers.get(host, [])

    return await resolve_policy(policy, lookup, dns)


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
    target: Target,
    policy: NetworkPolicy,
    resolved: Resolution,
    candidates: list[tuple[IPAddress, int]],
    timeout_s: float,
) -> float:
    """Dial a forbidden destination until refused; returns seconds until enforced."""
    probe = forbidden_probe(policy, resolved, candidates)
    if probe is None:
        return 0.0
    host, port = probe
    started = time.monotonic()
    deadline = started + timeout_s
    argv = ["sh", "-c", _DIAL, "sh", str(host), str(port)]
    while True:
        seen = (await sandbox_exec(target, argv, 30)).strip()
        if seen == "refused":
            return time.monotonic() - started
        if seen != "connected":
            raise ProviderError(f"the policy probe could not run in the Pod (got {seen!r})")
        if time.monotonic() > deadline:
            raise NetworkPolicyNotEnforced(
                f"{host}:{port}, which {policy} forbids, still answered {timeout_s:.0f} s "
                "after the NetworkPolicy was applied; the cluster's CNI does not enforce "
                "NetworkPolicy (or fails open)"
            )
        await anyio.sleep(0.25)
