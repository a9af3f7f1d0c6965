"""A `docker` session's holder: the container that owns the sandbox's network namespace,
and the policy that namespace enforces.

It keeps where the holder sits on the session's network and what the policy in force was
resolved to; it applies a policy (resolve, render, probe), stamps the rules in force with a
new phase, follows names whose addresses move, and probes a new runtime once from inside
the sandbox. The session (`session`) owns the policy and the phase and hands them in.
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from typing import Any

import anyio

from corral.core.logs import event
from corral.network.events import EventLog
from corral.network.iptables import Endpoint
from corral.network.policy import NetworkPolicy, Phase
from corral.network.probe import DISCARD_PORT, forbidden_probe
from corral.network.resolve import Resolution, needs_dns
from corral.network.targets import EntryType, IPAddress
from corral.network.wildcard import uses_resolver
from corral.providers.docker.enforcement import (
    Upstream,
    apply_policy,
    probe_from_sandbox,
    resolve,
)
from corral.providers.docker.engine import Engine
from corral.providers.docker.resources import network_name, remove_container

log = logging.getLogger("corral.docker")


def network_endpoint(holder: dict[str, Any], session_id: str) -> dict[str, Any]:
    """The engine's view of the holder's endpoint on the session's network."""
    return holder["NetworkSettings"]["Networks"][network_name(session_id)]


def gateway_of(holder: dict[str, Any], session_id: str) -> IPAddress:
    """The session network's gateway (the engine's host), as the holder was inspected."""
    return ipaddress.ip_address(network_endpoint(holder, session_id)["Gateway"])


class HolderNet:
    """The holder container (inspected as `info`) of session `session_id`, whose namespace
    the sandbox container `sandbox` (run by `runtime`) shares."""

    def __init__(
        self,
        engine: Engine,
        info: dict[str, Any],
        *,
        session_id: str,
        sandbox: str,
        runtime: str,
        link_owner: str | None,
        dns: tuple[IPAddress, ...],
        extra_hosts: dict[str, str],
        labels: dict[str, str],
        upstream: Upstream,
        verified_runtimes: set[str],
        events: EventLog,
        endpoints: tuple[Endpoint, ...] = (),
        resolution: Resolution | None = None,
    ) -> None:
        endpoint = network_endpoint(info, session_id)
        ports: dict[str, list[dict[str, str]] | None] = info["NetworkSettings"].get("Ports") or {}
        self.engine = engine
        #: the holder container's id
        self.holder: str = info["Id"]
        self.session_id = session_id
        self.sandbox = sandbox
        self.runtime = runtime
        #: under a gateway, the net container that owns the sandbox's namespace
        self.link_owner = link_owner
        #: the session's network, by id (its name may be repeated)
        self.network: str = endpoint["NetworkID"]
        self.gateway = ipaddress.ip_address(endpoint["Gateway"])
        #: the holder's own address on the network ("" if the engine gives none)
        self.address: str = endpoint.get("IPAddress", "")
        #: the plan's published ports: sandbox port -> loopback port on the engine's host
        self.published = {
            int(key.split("/")[0]): int(bindings[0]["HostPort"])
            for key, bindings in ports.items()
            if bindings
        }
        self.local_engine = engine.api.base_url.startswith("http+docker://")
        self.dns = dns
        self.extra_hosts = extra_hosts
        self.labels = labels
        #: where corral's resolver forwards the names an allowlist allows (and where corral
        #: resolves them at apply time)
        self.upstream = upstream
        # Runtimes this environment has seen meet the namespace's rules (shared by its
        # sessions: bypassing netfilter is a property of the runtime, not of a sandbox).
        self.verified_runtimes = verified_runtimes
        #: refused attempts and admitted flows, stamped with their phase
        self.events = events
        #: what every policy of this session admits first (its credential proxy)
        self.endpoints = endpoints
        #: what the policy in force was resolved to (None: not known, resolve afresh)
        self.resolution = resolution

    def endpoint(self, port: int) -> str | None:
        """An address on the engine's host that reaches the sandbox's `port`, if any."""
        if port in self.published:
            return f"http://127.0.0.1:{self.published[port]}"
        if self.local_engine and self.address:
            return f"http://{self.address}:{port}"
        return None

    async def apply(
        self, policy: NetworkPolicy, *, in_force: NetworkPolicy, phase: Phase | None
    ) -> None:
        """Enforce `policy` in place of `in_force`: resolved, applied, probed."""
        resolved = await self._resolve(policy, in_force)
        await apply_policy(
            self.engine,
            self.holder,
            policy,
            resolved,
            probe_candidates=[(self.gateway, DISCARD_PORT)],
            phase=phase,
            events=self.events,
            endpoints=self.endpoints,
        )
        self.resolution = resolved
        await self.check_runtime(policy)

    async def restamp(self, policy: NetworkPolicy, phase: Phase | None) -> None:
        """The rules of `policy` (in force) again, their refusals stamped with `phase`: one
        restore (a denylist's is probed again; no other policy is)."""
        if self.resolution is None:
            return
        await apply_policy(
            self.engine,
            self.holder,
            policy,
            self.resolution,
            probe_candidates=[],
            phase=phase,
            events=self.events,
            endpoints=self.endpoints,
        )

    async def follow(self, policy: NetworkPolicy, phase: Phase | None) -> None:
        """For a session found again: `policy`'s hostnames resolved now and, if it has
        any, the policy applied again, so its rules follow today's addresses."""
        if _has_hostnames(policy):
            await self.apply(policy, in_force=policy, phase=phase)
        else:
            self.resolution = await self._resolve(policy, policy)

    async def refresh(self, policy: NetworkPolicy, phase: Phase | None) -> float | None:
        """`policy`'s hostnames resolved again, the policy applied again if they moved;
        the seconds until the answers expire, or None without hostnames."""
        if not _has_hostnames(policy):
            return None
        before = self.resolution
        resolved = await self._resolve(policy, policy)
        if before is None or resolved.addresses != before.addresses:
            await self.apply(policy, in_force=policy, phase=phase)
            event(log, "info", "names moved; policy applied again", sandbox=self.session_id)
        return resolved.ttl_s

    async def check_runtime(self, policy: NetworkPolicy) -> None:
        """Once per runtime, the first policy that forbids anything is probed from inside
        the sandbox container too (see `probe_from_sandbox`)."""
        if self.runtime in self.verified_runtimes or self.resolution is None:
            return
        probe = forbidden_probe(policy, self.resolution, [(self.gateway, DISCARD_PORT)])
        if probe is None:
            return
        await probe_from_sandbox(
            self.engine,
            self.holder,
            self.sandbox,
            probe,
            self.runtime,
            events=self.events,
        )
        self.verified_runtimes.add(self.runtime)

    async def _resolve(self, policy: NetworkPolicy, in_force: NetworkPolicy) -> Resolution:
        if uses_resolver(policy):
            # Asked of the upstream from the holder over corral's marked path, which works
            # whatever rules are in force (`enforcement.resolve`).
            return await self._resolve_from(policy, self.holder)
        if _has_hostnames(policy) and not needs_dns(in_force):
            # DNS is closed in this namespace right now; ask the same network's resolver
            # from a fresh twin of corral's image instead.
            async with self._twin() as twin:
                return await self._resolve_from(policy, twin)
        return await self._resolve_from(policy, self.holder)

    async def _resolve_from(self, policy: NetworkPolicy, container: str) -> Resolution:
        return await resolve(
            self.engine,
            container,
            policy,
            dns=self.dns,
            extra_hosts=self.extra_hosts,
            upstream=self.upstream,
        )

    @asynccontextmanager
    async def _twin(self) -> AsyncGenerator[str]:
        """A short-lived container of the holder's image on the session's network, removed
        by exact name."""
        name = f"corral-{self.session_id}-resolver-{secrets.token_hex(3)}"
        try:
            host_config = self.engine.api.create_host_config(
                network_mode=self.network,
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                auto_remove=True,  # gone by itself after its `sleep`, should corral die
            )
            await self.engine.call(
                self.engine.api.create_container,
                self.upstream.image,
                ["sleep", "60"],
                name=name,
                labels=self.labels,
                host_config=host_config,
            )
            await self.engine.call(self.engine.api.start, name)
            yield name
        finally:
            with anyio.CancelScope(shield=True):
                await remove_container(self.engine, name, self.session_id)


def _has_hostnames(policy: NetworkPolicy) -> bool:
    return any(t.entry_type is EntryType.HOSTNAME for t in policy.targets)
