"""NetworkPolicy objects for a session, and the probe that checks the CNI enforces them.

Many CNIs do not enforce NetworkPolicy, or fail open (kind's kindnetd does). So after
every apply a destination the policy forbids is dialled from the Pod's `corral-probe`
container until it is refused; if it still answers after `verify_timeout_s`, the policy
is not enforced. Hostnames are resolved from that container too, by corral's own DNS
queries to the resolvers corral chose, after the harness's `host_aliases`.

Every write of the spec also writes the policy it renders, normalized, to the object's
`corral.policy` annotation in the same request: what `attach` reads back is then exactly
what the CNI was given, never a copy in memory or anything inside the Pod.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from corral.errors import NetworkPolicyNotEnforced, ProviderError
from corral.network.dns import Answer, resolve_names
from corral.network.netpol import render_network_policy
from corral.network.policy import NetworkMode, NetworkPolicy
from corral.network.probe import allows, forbidden_probe
from corral.network.resolve import Resolution, hostnames, resolve_policy
from corral.network.targets import IPAddress
from corral.providers.k8s import probe
from corral.providers.k8s.api import explain, idempotent
from corral.providers.k8s.execution import Target

POLICY = "corral.policy"


async def resolve(
    prober: Target,
    policy: NetworkPolicy,
    servers: Sequence[IPAddress],
    static: Mapping[str, str],
) -> Resolution:
    """Resolve the policy's hostnames from the probe container (none: no exec at all)."""
    hosts = hostnames(policy)
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
    body = render_network_policy(
        policy, resolved, {"corral.session": session_id}, name=name, labels=labels
    )
    body["metadata"]["annotations"] = {POLICY: policy.model_dump_json()}
    return body


def policy_in_force(found: Any) -> NetworkPolicy:
    """The policy a session's NetworkPolicy object enforces, as its annotation records it;
    ProviderError when it records none that parses (corral never guesses a policy)."""
    name: str = found.metadata.name
    annotations: dict[str, str] = found.metadata.annotations or {}
    raw = annotations.get(POLICY)
    if raw is None:
        raise ProviderError(
            f"NetworkPolicy {name} carries no {POLICY} annotation, so the policy it enforces "
            "is unknown; close the session rather than attach to it"
        )
    try:
        return NetworkPolicy.model_validate_json(raw)
    except ValidationError as exc:
        raise ProviderError(
            f"NetworkPolicy {name}: annotation {POLICY}={raw[:200]!r} is not a policy "
            f"({exc.errors()[0]['msg']}); close the session rather than attach to it"
        ) from None


async def replace_spec(clients: Any, namespace: str, name: str, body: dict[str, Any]) -> None:
    """Switch by patching the one object: the CNI never sees it absent, and its policy
    annotation changes with its spec."""
    patch = {"metadata": {"annotations": body["metadata"]["annotations"]}, "spec": body["spec"]}
    try:
        await idempotent(
            clients.tokens,
            clients.networking.patch_namespaced_network_policy,
            name,
            namespace,
            patch,
        )
    except ApiException as exc:
        raise ProviderError(f"patching NetworkPolicy {name}: {explain(exc)}") from None


async def answering(
    prober: Target, destinations: list[tuple[IPAddress, int]], dialler: str | None
) -> list[tuple[IPAddress, int]]:
    """Which of `destinations` connect from the Pod now, dialled at once."""
    seen = await probe.dial_each(prober, destinations, dialler)
    return [d for d, connected in zip(destinations, seen, strict=True) if connected]


async def verify(
    prober: Target,
    policy: NetworkPolicy,
    resolved: Resolution,
    candidates: list[tuple[IPAddress, int]],
    timeout_s: float,
    *,
    dialler: str | None = None,
    answered: list[tuple[IPAddress, int]] | None = None,
) -> float:
    """Dial what the policy forbids until refused; returns seconds until enforced.

    `answered`: destinations that connected under the policy before this one and that it
    forbids (`probe.narrowed`), each dialled until refused; then the first forbidden
    candidate; then, unless IPv6 is off in the Pod, the node over IPv6 (link-local through
    the gateway, and its own IPv6 addresses) wherever the policy forbids it: a CNI that
    polices IPv4 only must not pass. `dialler`: corral's helper in the probe container
    (`probe.dial`), else busybox."""
    targets = list(answered or [])
    forbidden = forbidden_probe(policy, resolved, candidates)
    if forbidden is not None and forbidden not in targets:
        targets.append(forbidden)
    started = time.monotonic()
    deadline = started + timeout_s
    await _until_refused(prober, policy, targets, deadline, dialler, timeout_s)
    # After the IPv4 dials, which had the Pod learn its gateway's MAC.
    over_ipv6 = await _ipv6_forbidden(prober, policy, resolved, candidates)
    if over_ipv6 and dialler is None:
        raise NetworkPolicyNotEnforced(
            f"IPv6 is on in Pod {prober.pod} and busybox's dial cannot reach a link-local "
            "address, so no policy can be shown to hold over IPv6; keep disable_ipv6=True"
        )
    await _until_refused(prober, policy, over_ipv6, deadline, dialler, timeout_s)
    return time.monotonic() - started


async def _ipv6_forbidden(
    prober: Target,
    policy: NetworkPolicy,
    resolved: Resolution,
    candidates: list[tuple[IPAddress, int]],
) -> list[tuple[IPAddress, int]]:
    """The node's IPv6 destinations `policy` forbids (`probe.ipv6_destinations`)."""
    if policy.network_mode is NetworkMode.PUBLIC or not candidates:
        return []
    nodes = [host for host, _ in candidates]
    found = await probe.ipv6_destinations(prober, nodes, candidates[0][1])
    return [d for d in found if not allows(policy, resolved, *d)]


async def _until_refused(
    prober: Target,
    policy: NetworkPolicy,
    targets: list[tuple[IPAddress, int]],
    deadline: float,
    dialler: str | None,
    timeout_s: float,
) -> None:
    for host, port in targets:
        while await probe.dial(prober, str(host), port, dialler):
            if time.monotonic() > deadline:
                raise NetworkPolicyNotEnforced(
                    f"{host}:{port}, which {policy} forbids, still answered {timeout_s:.0f} s "
                    "after the NetworkPolicy was applied; the cluster's CNI does not enforce "
                    f"NetworkPolicy (or fails open){_over_ipv6(host)}"
                )
            await anyio.sleep(0.25)


def _over_ipv6(host: IPAddress) -> str:
    if host.version == 4:
        return ""
    return " over IPv6: keep disable_ipv6=True (the kubelet allowing its sysctls) to turn it off"
