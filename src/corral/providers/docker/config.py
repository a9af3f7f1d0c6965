"""Configuration of the `docker` provider."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, SecretStr, field_validator

from corral.core.config import RuntimeEnvironmentConfig
from corral.core.output import DEFAULT_OUTPUT_LIMIT
from corral.core.privileges import SAFE_CAPABILITIES, SafeCapabilities, UnsafeCapabilities
from corral.providers.docker.mounts import hazard, parse_mount


class DockerConfig(RuntimeEnvironmentConfig):
    """A container per sandbox on a Docker Engine, egress enforced by a holder container."""

    type: Literal["docker"] = Field(
        default="docker", description="the provider; picks this config out of a ProviderConfig"
    )
    base_url: str | None = Field(
        default=None,
        description="engine address (unix:// or tcp://); default: DOCKER_HOST or the local socket",
    )
    tls_verify: bool | None = Field(
        default=None, description="verify the engine's TLS certificate (default: DOCKER_TLS_VERIFY)"
    )
    tls_cert_path: str | None = Field(
        default=None, description="directory with ca.pem, cert.pem, key.pem (DOCKER_CERT_PATH)"
    )
    registry_password: SecretStr | None = Field(
        default=None, description="password for pulls from a private registry (never logged)"
    )
    registry_username: str | None = Field(default=None, description="registry user for pulls")
    holder_image: str = Field(
        default="corral.local/holder:bookworm",
        description="image of the network holder (iptables + busybox); "
        "build it with `corral docker build-holder`",
    )
    pull_policy: Literal["if-not-present", "always", "never"] = Field(
        default="if-not-present", description="when to pull the sandbox and holder images"
    )
    address_pool: str = Field(
        default="10.213.0.0/16",
        description="IPv4 block corral carves one small network per sandbox from",
    )
    ipv6_pool: str | None = Field(
        default=None,
        description="IPv6 block (a ULA /48 or larger) to give each sandbox network a /64 "
        "from; None: IPv4 only (ip6tables rules are applied either way)",
    )
    network_prefix_len: int = Field(
        default=28, ge=16, le=29, description="prefix length of each sandbox network"
    )
    runtime: str | None = Field(
        default=None,
        description="OCI runtime of the sandbox (default: the engine's), e.g. runsc (gVisor). "
        "A policy that forbids anything is probed from inside the sandbox once per runtime: "
        "one whose packets skip corral's rules is refused",
    )
    gateway: bool | None = Field(
        default=None,
        description="give the sandbox a network namespace of its own whose only route leads "
        "through the holder's, so its packets meet corral's rules whatever network stack "
        "sends them (gVisor's runsc has its own); None: for any runtime but runc. IPv4 only; "
        "a plan's services are refused behind it",
    )
    user: str | None = Field(default=None, description="user the workload runs as (uid[:gid])")
    capabilities: SafeCapabilities = Field(
        default=SAFE_CAPABILITIES,
        description="capabilities the sandbox keeps after dropping ALL, from Docker's default "
        "set minus NET_RAW",
    )
    unsafe_capabilities: UnsafeCapabilities = Field(
        default=(),
        description="capabilities outside that set granted anyway (e.g. SYS_PTRACE), each "
        "weakening the sandbox's isolation from the host; logged at every open. NET_ADMIN, "
        "NET_RAW, SYS_ADMIN and ALL are never granted",
    )
    pids_limit: int = Field(default=4096, ge=16, description="max processes in the sandbox")
    default_cpu: float | None = Field(
        default=None, gt=0, description="CPU cores when the plan sets none"
    )
    default_memory_mb: int | None = Field(
        default=None, gt=0, description="memory limit in MiB when the plan sets none"
    )
    mounts: tuple[str, ...] = Field(
        default=(),
        description="bind mounts as host:container[:ro|rw]; host paths that expose the host "
        "(/, /proc, /sys, /dev, /etc, /boot, /root, /run, /var/run, /var/lib/docker, "
        "/var/lib/containerd, /var/lib/kubelet, any socket, or a parent of these) are "
        "refused, and /usr, /bin, /sbin and /lib* are bound only with :ro",
    )
    unsafe_mounts: tuple[str, ...] = Field(
        default=(),
        description="bind mounts (host:container[:ro|rw]) granted although they expose the "
        "host, such as the engine's socket; logged at every open",
    )
    extra_hosts: dict[str, str] = Field(
        default_factory=dict[str, str],
        description="hostname -> address entries for /etc/hosts ('host-gateway' allowed)",
    )
    upstream_dns_servers: tuple[str, ...] | None = Field(
        default=None,
        description="IP addresses of the upstream resolvers for allowlists that name hosts "
        "(exact or wildcard): corral's own resolver (in the holder, the sandbox's only one "
        "under such a policy) forwards the allowed names there, and corral resolves the "
        "policy's names there at apply time, over TCP port 53; default: the engine's, read "
        "once per process from a container on its default bridge network",
    )
    published_ports: tuple[int, ...] = Field(
        default=(), description="sandbox ports published on 127.0.0.1 for endpoint()"
    )
    output_limit_bytes: int = Field(
        default=DEFAULT_OUTPUT_LIMIT, ge=1024, description="bytes of stdout/stderr kept per exec"
    )
    exec_channel: bool = Field(
        default=True,
        description="run execs through one helper process per sandbox (corral's static "
        "corral-exec binary, copied in and started once over a long-lived exec stream) "
        "instead of one engine exec each; where the helper is missing or cannot run, "
        "execs fall back to plain engine execs and the logs say so",
    )
    network_events: bool = Field(
        default=True,
        description="record every refused egress attempt (session.network_events()): "
        "corral's helper runs in the holder as the reader of the rules' NFLOG group; "
        "where it cannot start, network_events() raises FeatureUnsupported saying why",
    )
    network_events_limit: int = Field(
        default=1000,
        ge=1,
        le=1_000_000,
        description="refused attempts (events) kept per sandbox; older ones are dropped "
        "and counted",
    )
    api_timeout_s: float = Field(
        default=60.0, gt=0, description="seconds one Engine API call may take"
    )
    max_workers: int = Field(
        default=64, ge=1, description="worker threads for blocking Engine API calls"
    )
    warm_pool_size: int = Field(
        default=2,
        ge=1,
        description="idle sandboxes warm_pool() keeps ready per pool key (image, baseline "
        "policy, env, resources, workdir, command, labels, max_lifetime_s)",
    )
    warm_pool_max_idle_s: float = Field(
        default=600.0,
        gt=0,
        description="seconds a pooled sandbox may wait unused before the pool replaces it; "
        "`corral gc` removes idle pooled sandboxes older than this",
    )

    snapshot_lifetime_s: float = Field(
        default=86400.0,
        gt=0,
        le=365 * 86400,
        description="seconds a snapshot image from session.save() is kept for fork(); "
        "`corral gc` removes it after that",
    )

    @property
    def routed(self) -> bool:
        """Whether sandboxes get a gateway (`gateway`, else every runtime but runc's)."""
        if self.gateway is not None:
            return self.gateway
        return self.runtime not in (None, "runc")

    @field_validator("upstream_dns_servers")
    @classmethod
    def _upstream_dns_servers(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        servers: list[str] = []
        for server in value:
            try:
                address = ipaddress.ip_address(server)
            except ValueError:
                raise ValueError(
                    f"upstream_dns_servers entry {server!r} is not an IP address"
                ) from None
            if address.is_loopback or address.is_unspecified:
                raise ValueError(
                    f"upstream_dns_servers entry {server!r} would be the sandbox's own "
                    "namespace; give an address outside it"
                )
            servers.append(str(address))
        return tuple(servers) or None

    @field_validator("address_pool")
    @classmethod
    def _pool(cls, value: str) -> str:
        try:
            net = ipaddress.IPv4Network(value, strict=True)
        except ValueError as exc:
            raise ValueError(f"address_pool {value!r} is not an IPv4 CIDR: {exc}") from None
        if net.prefixlen > 24:
            raise ValueError(f"address_pool {value!r} is too small; use /24 or larger")
        return str(net)

    @field_validator("ipv6_pool")
    @classmethod
    def _pool6(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            net = ipaddress.IPv6Network(value, strict=True)
        except ValueError as exc:
            raise ValueError(f"ipv6_pool {value!r} is not an IPv6 CIDR: {exc}") from None
        if net.prefixlen > 56:
            raise ValueError(f"ipv6_pool {value!r} is too small; use /56 or larger")
        return str(net)

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for mount in value:
            reason = hazard(parse_mount(mount))
            if reason is not None:
                raise ValueError(
                    f"mount {mount!r} would give the sandbox the host ({reason}); to bind it "
                    "anyway, move it to unsafe_mounts"
                )
        return value

    @field_validator("unsafe_mounts")
    @classmethod
    def _unsafe_mounts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for mount in value:
            if hazard(parse_mount(mount)) is None:
                raise ValueError(f"mount {mount!r} is safe; list it in mounts, not unsafe_mounts")
        return value
