"""The `k8s` provider.

Per session: a NetworkPolicy selecting the Pod by a label unique to the session, created
before the Pod; then the Pod (the sandbox container and corral's `corral-probe`), whose
workload waits behind a gate until corral has applied and probed the baseline. The
NetworkPolicy carries an ownerReference to the Pod, so the cluster's garbage collector
removes it if corral dies.
"""

from __future__ import annotations

import contextlib
import ipaddress
import time
from contextlib import AsyncExitStack
from typing import Any, ClassVar

import anyio
from kubernetes.client.exceptions import ApiException

from corral.core.environment import BaseEnvironment
from corral.core.labels import OWNER, SESSION, is_expired, new_session_id, session_labels
from corral.core.plan import ExecutionPlan
from corral.core.session import EnvironmentSession
from corral.errors import ConfigError, NetworkPolicyNotEnforced, ProviderError
from corral.network.policy import NetworkMode, NetworkPolicy
from corral.network.resolve import Resolution
from corral.network.targets import EntryType, IPAddress
from corral.providers.k8s import enforcement, probe
from corral.providers.k8s.api import Api, call, connect, explain, idempotent, status_of
from corral.providers.k8s.config import KubernetesConfig
from corral.providers.k8s.execution import Target, run_exec
from corral.providers.k8s.pod import CONTAINER, READY_FILE, manifest, wait_running
from corral.providers.k8s.reaper import Reaper
from corral.providers.k8s.session import KubernetesSession


class KubernetesEnvironment(BaseEnvironment):
    id: ClassVar[str] = "k8s"
    config_model = KubernetesConfig
    supported_network_modes = frozenset(NetworkMode)
    supported_allowlist_entry_types = frozenset(EntryType) - {EntryType.WILDCARD_HOSTNAME}
    supports_network_target_ports = True
    supports_dynamic_network_policy = True
    max_concurrent_opens = 16

    config: KubernetesConfig

    def __init__(self, config: KubernetesConfig | None = None, **params: Any) -> None:
        super().__init__(config, **params)
        self._clients: Api | None = None
        self._dns_servers: tuple[IPAddress, ...] | None = None

    async def clients(self) -> Api:
        if self._clients is None:
            # Loading a kubeconfig reads files (and may run an exec credential plugin).
            clients = await anyio.to_thread.run_sync(connect, self.config)
            await self._check_namespace(clients)
            self._clients = clients
        return self._clients

    async def _resolvers(self) -> tuple[IPAddress, ...]:
        """The sandbox's resolvers, chosen here and never read from inside a Pod."""
        if self._dns_servers is None:
            if self.config.dns_servers is not None:
                found = self.config.dns_servers
            else:
                found = await _cluster_dns(await self.clients(), self.config.max_workers)
            self._dns_servers = tuple(ipaddress.ip_address(s) for s in found)
        return self._dns_servers

    async def _check_namespace(self, clients: Api) -> None:
        tokens = self.config.max_workers
        namespace = self.config.namespace
        try:
            await idempotent(
                tokens, clients.core.read_namespace, namespace, _request_timeout=(3, 10)
            )
        except ApiException as exc:
            if status_of(exc) == 404 and self.config.create_namespace:
                body = {"metadata": {"name": namespace, "labels": {OWNER: self.config.owner}}}
                with contextlib.suppress(ApiException):
                    await call(tokens, clients.core.create_namespace, body)
                return
            if status_of(exc) == 404:
                raise ConfigError(
                    f"namespace {namespace!r} does not exist (set create_namespace=True to let "
                    "corral create it)"
                ) from None
            if status_of(exc) == 403:
                raise ProviderError(f"forbidden by RBAC: {explain(exc)}") from None
            raise ProviderError(f"the API server refused: {explain(exc)}") from None
        except ProviderError as exc:
            raise ProviderError(
                f"the Kubernetes API server at {clients.host} does not answer: {exc}"
            ) from None

    async def _open(
        self, plan: ExecutionPlan, owned: AsyncExitStack, *, session_id: str | None
    ) -> EnvironmentSession:
        cfg = self.config
        tokens = cfg.max_workers
        clients = await self.clients()
        dns = await self._resolvers()
        image = plan.require_image(self.id)
        if not isinstance(image, str):
            raise ConfigError(f"native selector {image!r} is not supported by k8s; give an image")
        sid = session_id or new_session_id()
        lifetime = plan.timeouts.max_lifetime_s or cfg.default_lifetime_s
        labels = session_labels(cfg.owner, sid, lifetime, {**cfg.labels, **plan.labels})
        name = f"corral-{sid}"
        namespace = cfg.namespace
        baseline = plan.network.baseline
        hostnames = any(t.entry_type is EntryType.HOSTNAME for t in baseline.targets)
        # Until the Pod runs, hostnames cannot be resolved as it resolves them: such a
        # baseline starts as no-network and is patched in before the workload's gate opens.
        initial = NetworkPolicy.no_network() if hostnames else baseline
        body = enforcement.render(initial, Resolution(), name, sid, labels)
        owned.push_async_callback(self._delete, "network_policy", name, sid)
        created_policy: Any = await enforcement.create(clients, tokens, namespace, body)

        owned.push_async_callback(self._delete, "pod", name, sid)
        try:
            pod: Any = await call(
                tokens,
                clients.core.create_namespaced_pod,
                namespace,
                manifest(name, image, plan, cfg, labels, dns),
            )
        except ApiException as exc:
            raise ProviderError(f"the API server rejected Pod {name}: {explain(exc)}") from None
        await self._own(clients, name, pod.metadata.uid, created_policy.metadata.name)
        pod = await wait_running(clients, tokens, namespace, name)
        target = Target(clients, tokens, namespace, name, CONTAINER)
        host_ip = ipaddress.ip_address(pod.status.host_ip)
        session = KubernetesSession(
            id=sid,
            policy=initial,
            target=target,
            prober=target.sibling(probe.CONTAINER),
            policy_name=name,
            labels=labels,
            dns=dns,
            host_aliases=cfg.host_aliases,
            probe_candidates=[(host_ip, cfg.probe_port)],
            verify=cfg.verify_policy == "probe",
            verify_timeout_s=cfg.verify_timeout_s,
            workdir=next(c for c in pod.spec.containers if c.name == CONTAINER).working_dir or "/",
            output_limit=cfg.output_limit_bytes,
            default_timeout=plan.timeouts.operation_s,
            reaper=Reaper(
                target, cfg.probe_image, cfg.image_pull_policy, cfg.end_workload_timeout_s
            ),
        )
        session.image = image
        try:
            if hostnames:
                dns_only = NetworkPolicy.allowlist(*(str(s) for s in dns)) if dns else initial
                await session.enforce(dns_only)
            if initial != baseline or cfg.verify_policy == "probe":
                await session.enforce(baseline)
            session.policy = baseline
        except NetworkPolicyNotEnforced as exc:
            raise NetworkPolicyNotEnforced(f"sandbox {sid}: {exc}; nothing was kept") from None
        gate = await run_exec(
            target,
            ["touch", READY_FILE],
            cwd=None,
            env={},
            stdin=None,
            timeout=30,
            on_output=None,
            output_limit=4096,
        )
        if gate.returncode != 0:
            raise ProviderError(f"could not open the workload gate in Pod {name}: {gate.stderr}")
        return session

    async def _own(self, clients: Api, pod: str, uid: str, policy: str) -> None:
        """Make the Pod the NetworkPolicy's owner, for the garbage collector."""
        patch = {
            "metadata": {
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid}]
            }
        }
        await idempotent(
            self.config.max_workers,
            clients.networking.patch_namespaced_network_policy,
            policy,
            self.config.namespace,
            patch,
        )

    async def _delete(self, kind: str, name: str, session_id: str) -> None:
        """Delete one object by exact name, only if it carries this session's label."""
        clients = await self.clients()
        tokens = self.config.max_workers
        namespace = self.config.namespace
        api = clients.core if kind == "pod" else clients.networking
        read = getattr(api, f"read_namespaced_{kind}")
        delete = getattr(api, f"delete_namespaced_{kind}")
        try:
            found: Any = await idempotent(tokens, read, name, namespace)
        except ApiException as exc:
            if status_of(exc) == 404:
                return
            raise
        labels: dict[str, str] = found.metadata.labels or {}
        if labels.get(SESSION) != session_id:
            raise ProviderError(f"{kind} {name} is not session {session_id}'s; left alone")
        body = {"preconditions": {"uid": found.metadata.uid}, "gracePeriodSeconds": 0}
        with contextlib.suppress(ApiException):
            await idempotent(tokens, delete, name, namespace, body=body)

    async def gc(self) -> list[str]:
        clients = await self.clients()
        tokens = self.config.max_workers
        owner = self.config.owner
        removed: list[str] = []
        now = time.time()
        selector = f"{OWNER}={owner}"
        for kind, api in (("pod", clients.core), ("network_policy", clients.networking)):
            listed: Any = await idempotent(
                tokens,
                getattr(api, f"list_namespaced_{kind}"),
                self.config.namespace,
                label_selector=selector,
            )
            for item in listed.items:
                labels: dict[str, str] = item.metadata.labels or {}
                if is_expired(labels, owner, now):
                    await self._delete(kind, item.metadata.name, labels[SESSION])
                    removed.append(f"{kind.replace('_', '')} {item.metadata.name}")
        return removed


async def _cluster_dns(clients: Api, tokens: int) -> tuple[str, ...]:
    """The ClusterIP of kube-system/kube-dns, or none when the cluster has no such Service."""
    try:
        service: Any = await idempotent(
            tokens, clients.core.read_namespaced_service, "kube-dns", "kube-system"
        )
    except ApiException as exc:
        if status_of(exc) == 404:
            return ()
        raise ProviderError(
            f"reading Service kube-system/kube-dns for the sandbox's resolver: {explain(exc)}; "
            "set dns_servers in the provider config"
        ) from None
    ips: list[str] = list(service.spec.cluster_i_ps or [service.spec.cluster_ip])
    return tuple(ip for ip in ips if ip and ip != "None")
