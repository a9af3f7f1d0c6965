"""Configuration of the `k8s` provider."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from corral.core.config import RuntimeEnvironmentConfig
from corral.core.output import DEFAULT_OUTPUT_LIMIT
from corral.network.targets import EntryType, normalize_host

_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class KubernetesConfig(RuntimeEnvironmentConfig):
    """A Pod per sandbox; egress enforced by a NetworkPolicy and verified by a probe."""

    mutually_exclusive: ClassVar[tuple[tuple[str, ...], ...]] = (("kubeconfig", "in_cluster"),)

    kubeconfig: str | None = Field(
        default=None, description="path to a kubeconfig (default: KUBECONFIG or ~/.kube/config)"
    )
    context: str | None = Field(default=None, description="kubeconfig context to use")
    in_cluster: bool = Field(
        default=False, description="use the service account of the Pod corral runs in"
    )
    namespace: str = Field(default="corral", description="namespace the sandboxes run in")
    create_namespace: bool = Field(
        default=False, description="create the namespace when it does not exist"
    )
    service_account: str | None = Field(
        default=None, description="service account of sandbox Pods (default: none mounted)"
    )
    image_pull_policy: Literal["IfNotPresent", "Always", "Never"] = Field(
        default="IfNotPresent", description="imagePullPolicy of the sandbox and probe containers"
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict[str, str], description="node labels the Pod must match"
    )
    tolerations: tuple[dict[str, Any], ...] = Field(
        default=(), description="Pod tolerations, as in the Pod spec"
    )
    affinity: dict[str, Any] | None = Field(
        default=None, description="Pod affinity, as in the Pod spec"
    )
    runtime_class_name: str | None = Field(
        default=None, description="runtimeClassName, e.g. gvisor"
    )
    cpu_request: str | None = Field(
        default=None, description="CPU request in cores or millicores (e.g. 500m)"
    )
    cpu_limit: str | None = Field(default=None, description="CPU limit (e.g. 2)")
    memory_request: str | None = Field(default=None, description="memory request (e.g. 256Mi)")
    memory_limit: str | None = Field(default=None, description="memory limit (e.g. 1Gi)")
    run_as_user: int | None = Field(default=None, ge=0, description="uid of the workload")
    security_context: dict[str, Any] = Field(
        default_factory=lambda: {
            "allowPrivilegeEscalation": False,
            "capabilities": {
                "drop": ["ALL"],
                "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "KILL"],
            },
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        description="container securityContext (default: drop ALL, no escalation, "
        "seccomp RuntimeDefault)",
    )
    annotations: dict[str, str] = Field(
        default_factory=dict[str, str], description="annotations on every object"
    )
    verify_policy: Literal["probe", "off"] = Field(
        default="probe",
        description="after each apply, probe a forbidden destination from inside the Pod; "
        "'off' trusts the CNI (never do that with kind's kindnetd)",
    )
    verify_timeout_s: float = Field(
        default=20.0, gt=0, description="seconds the CNI gets to enforce a policy"
    )
    probe_port: int = Field(
        default=10250,
        ge=1,
        le=65535,
        description="port on the node the probe aims at when the policy leaves it forbidden",
    )
    probe_image: str = Field(
        default="corral.local/holder:bookworm",
        min_length=1,
        description="image of the Pod's `corral-probe` container (busybox with nc and xxd, "
        "tini): the policy probe and corral's DNS queries run there, out of the workload's "
        "reach; it shares only the Pod's network namespace",
    )
    host_aliases: dict[str, str] = Field(
        default_factory=dict[str, str],
        description="hostname -> IP address entries owned by the harness: written to the "
        "Pod's hostAliases and used by corral before DNS when it resolves a policy",
    )
    dns_servers: tuple[str, ...] | None = Field(
        default=None,
        description="IP addresses of the Pod's resolvers (dnsPolicy None), the only ones "
        "corral queries and lets DNS through to; default: the ClusterIP of the "
        "kube-system/kube-dns Service when there is one, else none (hostnames then resolve "
        "only through host_aliases)",
    )
    output_limit_bytes: int = Field(
        default=DEFAULT_OUTPUT_LIMIT, ge=1024, description="bytes of stdout/stderr kept per exec"
    )
    max_workers: int = Field(default=64, ge=1, description="worker threads for blocking API calls")

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not _DNS_LABEL.match(value):
            raise ValueError(f"namespace {value!r} is not a valid DNS label")
        return value

    @field_validator("cpu_request", "cpu_limit", "memory_request", "memory_limit")
    @classmethod
    def _quantity(cls, value: str | None) -> str | None:
        if value is not None and not _QUANTITY.match(value):
            raise ValueError(f"resource quantity {value!r} is not valid (e.g. 500m, 2, 256Mi)")
        return value

    @field_validator("host_aliases")
    @classmethod
    def _host_aliases(cls, value: dict[str, str]) -> dict[str, str]:
        aliases: dict[str, str] = {}
        for name, address in value.items():
            host, kind = normalize_host(name)
            if kind is not EntryType.HOSTNAME:
                raise ValueError(f"host_aliases key {name!r} is not a hostname")
            try:
                aliases[host] = str(ipaddress.ip_address(address))
            except ValueError:
                raise ValueError(
                    f"host_aliases[{name!r}] = {address!r} is not an IP address"
                ) from None
        return aliases

    @field_validator("dns_servers")
    @classmethod
    def _dns_servers(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        if len(value) > 3:
            raise ValueError(f"dns_servers {list(value)} lists more than the 3 a Pod can have")
        servers: list[str] = []
        for server in value:
            try:
                servers.append(str(ipaddress.ip_address(server)))
            except ValueError:
                raise ValueError(f"dns_servers entry {server!r} is not an IP address") from None
        return tuple(servers)
