"""Configuration of the `k8s` provider."""

from __future__ import annotations

import ipaddress
import posixpath
import re
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from corral.core.config import RuntimeEnvironmentConfig
from corral.core.output import DEFAULT_OUTPUT_LIMIT
from corral.core.privileges import UnsafeCapabilities
from corral.core.treelimits import TreeLimits
from corral.network.targets import EntryType, normalize_host
from corral.providers.k8s.security import SecurityContext

_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# Older clusters read seccomp and AppArmor settings from these (`...: unconfined`).
_CONFINEMENT_ANNOTATIONS = (
    "seccomp.security.alpha.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/",
    "container.apparmor.security.beta.kubernetes.io/",
)


class KubernetesConfig(RuntimeEnvironmentConfig):
    """A Pod per sandbox; egress enforced by a NetworkPolicy and verified by a probe."""

    mutually_exclusive: ClassVar[tuple[tuple[str, ...], ...]] = (("kubeconfig", "in_cluster"),)

    type: Literal["k8s"] = Field(
        default="k8s", description="the provider; picks this config out of a ProviderConfig"
    )
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
        default=None, description="service account of sandbox Pods (its token is not mounted)"
    )
    unsafe_service_account_token: bool = Field(
        default=False,
        description="mount the service account's API token into the sandbox, which hands "
        "the workload that account's rights (a NetworkPolicy it may patch is no boundary); "
        "logged at every open",
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
    security_context: SecurityContext = Field(
        default_factory=SecurityContext,
        description="container securityContext in the Pod spec's words, from an allowlist: "
        "runAsUser, runAsGroup, runAsNonRoot, readOnlyRootFilesystem, "
        "allowPrivilegeEscalation (false only), capabilities (drop must hold ALL; add from "
        "the safe set), seccompProfile and appArmorProfile (RuntimeDefault or Localhost), "
        "seLinuxOptions (type container_t or container_init_t), procMount (Default). "
        "Default: drop ALL, add CHOWN DAC_OVERRIDE FOWNER SETUID SETGID KILL, seccomp "
        "RuntimeDefault",
    )
    unsafe_capabilities: UnsafeCapabilities = Field(
        default=(),
        description="capabilities outside the safe set added anyway (e.g. SYS_PTRACE), each "
        "weakening the sandbox's isolation from the node; logged at every open. NET_ADMIN, "
        "NET_RAW, SYS_ADMIN and ALL are never granted",
    )
    annotations: dict[str, str] = Field(
        default_factory=dict[str, str],
        description="annotations on every object (not the seccomp or AppArmor ones: "
        "security_context sets those)",
    )
    verify_policy: Literal["probe", "off"] = Field(
        default="probe",
        description="after each apply, probe a forbidden destination from inside the Pod; "
        "'off' trusts the CNI (never do that with kind's kindnetd)",
    )
    verify_timeout_s: float = Field(
        default=20.0, gt=0, description="seconds the CNI gets to enforce a policy"
    )
    disable_ipv6: bool = Field(
        default=True,
        description="turn IPv6 off in each sandbox Pod (sysctls the kubelet must allow: "
        "--allowed-unsafe-sysctls=net.ipv6.conf.all.disable_ipv6,"
        "net.ipv6.conf.default.disable_ipv6); False only where the CNI polices IPv6, "
        "which the probe then checks",
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
        description="corral's own image (busybox with nc and xxd, tini) for the containers "
        "corral adds to a sandbox Pod: the `corral-probe` container, where the policy probe "
        "and corral's DNS queries run out of the workload's reach (it shares only the Pod's "
        "network namespace), and the reaper that ends a phase's processes",
    )
    end_workload_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="seconds to kill a phase's processes and show them gone (the reaper "
        "container included) before the session is closed",
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
    exec_channel: bool = Field(
        default=True,
        description="run the sandbox container's execs through one helper process per Pod "
        "(corral's static corral-exec binary, copied in with the image's tar and started "
        "once over a long-lived websocket exec) instead of one API server exec each; where "
        "the helper cannot be copied or run (no binary for the node's architecture, a "
        "container not running as root), execs fall back to plain execs and the logs say so",
    )
    warm_pool_size: int = Field(
        default=2,
        ge=1,
        description="idle Pods warm_pool() keeps ready per pool key (the Pod a cold open of "
        "the plan would create: image, env, resources, workdir, command, services, labels, "
        "max_lifetime_s, and this config's runtime class, securityContext, placement, "
        "probe image, DNS); they wait under a verified no-network NetworkPolicy and take "
        "the plan's baseline when claimed",
    )
    warm_pool_max_idle_s: float = Field(
        default=600.0,
        gt=0,
        description="seconds a pooled Pod may wait unclaimed before its pool replaces it; "
        "`corral gc` removes pooled Pods still idle past this (a dead harness's pool)",
    )
    max_workers: int = Field(default=64, ge=1, description="worker threads for blocking API calls")
    api_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="seconds an API server request may take to connect, and then to send "
        "each part of its answer, before it fails (idempotent calls are then retried)",
    )
    snapshot_paths: tuple[str, ...] | None = Field(
        default=None,
        description="absolute directories in the sandbox that session.save() keeps and a fork "
        "gets back (default: the session's working directory; processes, the policy and env "
        "are never saved)",
    )
    snapshot_dir: str | None = Field(
        default=None,
        description="directory on this host where saved snapshots are kept (default: "
        "$XDG_CACHE_HOME/corral/snapshots/k8s, else ~/.cache/corral/snapshots/k8s)",
    )
    snapshot_lifetime_s: float = Field(
        default=86400.0, gt=0, description="seconds a saved snapshot lasts before gc removes it"
    )
    snapshot_limits: TreeLimits = Field(
        default_factory=TreeLimits,
        description="bounds on each saved directory (the sandbox chooses what it holds): "
        "entries, bytes per file, bytes in all, bytes of the archive",
    )

    @field_validator("snapshot_paths")
    @classmethod
    def _snapshot_paths(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("snapshot_paths must list at least one directory (or be unset)")
        return tuple(snapshot_path(path) for path in value)

    @field_validator("annotations")
    @classmethod
    def _annotations(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if key.startswith(_CONFINEMENT_ANNOTATIONS):
                raise ValueError(
                    f"annotation {key!r} sets the sandbox's confinement; use security_context"
                )
        return value

    def opt_ins(self) -> dict[str, str]:
        found = super().opt_ins()
        if self.verify_policy == "off":
            found["verify_policy"] = "off"
        if not self.disable_ipv6:
            found["disable_ipv6"] = "false"
        return found

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


def snapshot_path(path: str) -> str:
    """`path` normalized, if a snapshot may hold it: absolute, no `..`, not `/` itself
    (which would take the Pod's /proc and /sys along)."""
    if not path.startswith("/") or ".." in path.split("/"):
        normal = ""
    else:  # normpath keeps a leading `//`, which POSIX leaves to the implementation
        normal = "/" + posixpath.normpath(path).lstrip("/")
    if normal in ("", "/"):
        raise ValueError(
            f"snapshot path {path!r} must be an absolute directory other than '/', without '..'"
        )
    return normal
