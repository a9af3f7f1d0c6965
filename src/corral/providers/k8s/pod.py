"""The sandbox Pod: its manifest, and waiting for Ready while failing fast on real causes."""

from __future__ import annotations

import ipaddress
import json
import math
from typing import Any

import anyio

from corral.core.plan import ExecutionPlan, Resources, ServiceSpec
from corral.core.redact import plain_env
from corral.errors import ConfigError, ProviderError
from corral.network.targets import IPAddress
from corral.providers.k8s import probe
from corral.providers.k8s.api import Api, idempotent
from corral.providers.k8s.config import KubernetesConfig
from corral.providers.k8s.execution import EXEC_ON_PATH

CONTAINER = "sandbox"
READY_FILE = "/tmp/.corral-ready"
# Annotations corral writes through the API server, where the workload (which holds no
# API token) cannot change them: what reattaching reads instead of anything in the Pod.
#: A random token per creating open, on the Pod and its NetworkPolicy: an undo deletes
#: only objects its own open made (never those of a concurrent open of the same id).
INSTANCE = "corral.instance"
#: Set once open has applied the baseline and opened the workload's gate.
OPENED = "corral.opened"
#: The plan's timeouts.operation_s, the default timeout of every exec.
OPERATION_TIMEOUT = "corral.operation-timeout-s"
#: The plan's service names, comma-separated: which containers of the Pod are services
#: (each runs as the container `SERVICE_PREFIX + name`). Reattaching trusts only this.
SERVICES = "corral.services"
#: A service's container name is its name under this prefix, which no container corral
#: adds itself (`sandbox`, `corral-probe`, `corral-reaper-*`) starts with.
SERVICE_PREFIX = "svc-"
_IDLE_FIFO = "/tmp/.corral-idle"
#: corral's programs: an emptyDir that corral's own containers fill (the init container
#: copies its image's static busybox, the exec channel puts its helper in through the
#: probe container) and the sandbox container mounts read-only at PROGRAMS. Nothing of the
#: image runs as PID 1 or for any command corral sends, so a replaced `sh`, `sleep` or
#: `touch` (in the Pod, or in a snapshot a fork is restored from) never runs for corral.
PROGRAMS_VOLUME = "corral-programs"
PROGRAMS = "/.corral"
BUSYBOX = f"{PROGRAMS}/busybox"
#: where corral's own containers (init, probe) have the volume, writable
PROGRAMS_RW = "/corral"
INIT_CONTAINER = "corral-programs"
# The workload's own command starts only once corral has applied and verified the
# baseline policy (it writes READY_FILE); until then nothing in the Pod talks. The shell
# is corral's busybox, whose applets it prefers to anything on the image's PATH. Without a
# plan.command it stays PID 1 and idles reading a FIFO it holds open itself: once the gate
# is open it never forks or execs, so after the reaper has killed every other process
# nothing comes back. A plan.command is looked up on the image's PATH (not among
# busybox's applets) and exec'd: it is the workload. Ignoring SIGCHLD lets the kernel reap
# the orphans PID 1 inherits.
_GATE = (
    f"mkfifo -m 600 {_IDLE_FIFO} && exec 3<>{_IDLE_FIFO} && rm {_IDLE_FIFO} || exit 1; "
    f"until [ -e {READY_FILE} ]; do sleep 0.1; done; "
    "[ $# -eq 0 ] || { exec 3<&-; " + EXEC_ON_PATH + "; }; "
    "trap 'exit 0' TERM; trap '' CHLD; while :; do read -r _ <&3; done"
)


#: The sandbox container's own /dev/shm: a Pod's containers otherwise share one tmpfs there,
#: which lets the workload read and rewrite a service's segments (PostgreSQL's, say).
SHM_VOLUME = "corral-shm"
#: IPv6 off in the Pod's network namespace before any of its containers starts. Every Pod
#: has an IPv6 link-local address, and many CNIs police IPv4 only (kube-router as the test
#: cluster runs it): the node's listeners on `::` (the kubelet, the API server) answer
#: fe80::<the gateway's MAC> whatever the NetworkPolicy says. The kubelet counts these
#: sysctls unsafe, so it must allow them (KUBELET_FLAG); it rejects a Pod that asks for
#: them otherwise, and `fatal` says so.
IPV6_OFF = ("net.ipv6.conf.all.disable_ipv6", "net.ipv6.conf.default.disable_ipv6")
KUBELET_FLAG = f"--allowed-unsafe-sysctls={','.join(IPV6_OFF)}"
#: A SysV shared memory segment goes when its creator exits and nothing is attached (at the
#: last detach otherwise): the Pod's containers share one IPC namespace, and without this
#: a segment the workload made outlives end_workload(). A sysctl every kubelet allows.
_SHM_RMID_FORCED = "kernel.shm_rmid_forced"


def _volumes() -> list[dict[str, Any]]:
    return [
        {"name": PROGRAMS_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}},
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
    ]


def _sysctls(cfg: KubernetesConfig) -> list[dict[str, str]]:
    names = (_SHM_RMID_FORCED, *(IPV6_OFF if cfg.disable_ipv6 else ()))
    return [{"name": name, "value": "1"} for name in names]


def corral_sh(script: str, *args: str) -> list[str]:
    """`script` run by corral's busybox shell in the sandbox container (its applets)."""
    return [BUSYBOX, "sh", "-c", script, "sh", *args]


def _programs_init(cfg: KubernetesConfig) -> dict[str, Any]:
    """Copies corral's busybox into the programs volume before the sandbox starts."""
    return {
        "name": INIT_CONTAINER,
        "image": cfg.probe_image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": ["/bin/busybox", "cp", "/bin/busybox", f"{PROGRAMS_RW}/busybox"],
        "securityContext": probe.SECURITY_CONTEXT,
        "resources": probe.RESOURCES,
        "volumeMounts": [{"name": PROGRAMS_VOLUME, "mountPath": PROGRAMS_RW}],
    }


POLL_MAX_S = 0.2
FATAL_WAITING = {
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "CrashLoopBackOff",
    "RunContainerError",
}


def _resources(wanted: Resources, cfg: KubernetesConfig) -> dict[str, dict[str, str]]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if cfg.cpu_request:
        requests["cpu"] = cfg.cpu_request
    if cfg.memory_request:
        requests["memory"] = cfg.memory_request
    if wanted.cpu or cfg.cpu_limit:
        limits["cpu"] = f"{int(wanted.cpu * 1000)}m" if wanted.cpu else str(cfg.cpu_limit)
    if wanted.memory_mb or cfg.memory_limit:
        limits["memory"] = f"{wanted.memory_mb}Mi" if wanted.memory_mb else str(cfg.memory_limit)
    if wanted.disk_mb:
        limits["ephemeral-storage"] = f"{wanted.disk_mb}Mi"
    if wanted.gpus:
        limits["nvidia.com/gpu"] = str(wanted.gpus)
    out: dict[str, dict[str, str]] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def manifest(
    name: str,
    image: str,
    plan: ExecutionPlan,
    cfg: KubernetesConfig,
    labels: dict[str, str],
    dns_servers: tuple[IPAddress, ...],
) -> dict[str, Any]:
    command = corral_sh(_GATE, *(plan.command or []))
    security = cfg.security_context.manifest(cfg.unsafe_capabilities)
    if cfg.run_as_user is not None:
        security["runAsUser"] = cfg.run_as_user
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": cfg.image_pull_policy,
        "command": command,
        "env": [{"name": k, "value": v} for k, v in plain_env(plan.env).items()],
        "securityContext": security,
        "resources": _resources(plan.resources, cfg),
        "volumeMounts": [
            {"name": PROGRAMS_VOLUME, "mountPath": PROGRAMS, "readOnly": True},
            {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
        ],
    }
    if plan.workdir:
        container["workingDir"] = plan.workdir
    beside = [_service(name, svc, cfg, security) for name, svc in plan.services.items()]
    spec: dict[str, Any] = {
        "initContainers": [_programs_init(cfg)],
        "containers": [container, probe.container(cfg, PROGRAMS_VOLUME, PROGRAMS_RW), *beside],
        "volumes": _volumes(),
        "securityContext": {"sysctls": _sysctls(cfg)},
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "enableServiceLinks": False,
        "automountServiceAccountToken": cfg.unsafe_service_account_token,
        "nodeSelector": {**cfg.node_selector, **(plan.resources.placement or {})} or None,
        "tolerations": list(cfg.tolerations) or None,
        "affinity": cfg.affinity,
        "runtimeClassName": cfg.runtime_class_name,
        "serviceAccountName": cfg.service_account,
    }
    # The kubelet ends the Pod at its lifetime even if corral died; `corral gc` deletes it.
    lifetime = plan.timeouts.max_lifetime_s or cfg.default_lifetime_s
    spec["activeDeadlineSeconds"] = math.ceil(lifetime)
    spec.update(_names(cfg, dns_servers))
    annotations = dict(cfg.annotations)
    if plan.timeouts.operation_s is not None:
        annotations[OPERATION_TIMEOUT] = str(plan.timeouts.operation_s)
    if plan.services:
        annotations[SERVICES] = ",".join(plan.services)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {k: v for k, v in spec.items() if v is not None},
    }


def service_container(name: str) -> str:
    """The container of the Pod that runs the plan's service `name`."""
    return SERVICE_PREFIX + name


def check_services(plan: ExecutionPlan) -> None:
    """Refuse, before anything is created, what a service cannot have on Kubernetes."""
    for name, service in plan.services.items():
        if service.resources.placement:
            raise ConfigError(
                f"service {name!r} sets resources.placement, but on Kubernetes a service is a "
                "container of the sandbox's Pod, on its node: set placement on the plan"
            )


def _service(
    name: str, service: ServiceSpec, cfg: KubernetesConfig, security: dict[str, Any]
) -> dict[str, Any]:
    """A service: a container of the sandbox's Pod (so in its network namespace, under
    its NetworkPolicy), with the sandbox's security context and its own PID namespace.

    It runs its image's own entrypoint (or `command`) from the start, not behind the
    workload's gate: the API server does not say what an image's entrypoint is, so it
    cannot be wrapped. A service is the task's infrastructure from the (trusted) plan,
    under the NetworkPolicy created before the Pod; the agent's workload starts only once
    the baseline is verified and every service is healthy.
    """
    container: dict[str, Any] = {
        "name": service_container(name),
        "image": service.image,
        "imagePullPolicy": cfg.image_pull_policy,
        # As for the sandbox, secret values reach the Pod spec (they are its environment)
        # and nothing else: never an annotation, a log line or an error.
        "env": [{"name": k, "value": v} for k, v in plain_env(service.env).items()],
        "securityContext": dict(security),
        "resources": _resources(service.resources, cfg),
    }
    if service.command is not None:
        container["command"] = list(service.command)
    if service.workdir:
        container["workingDir"] = service.workdir
    return container


def services(pod: Any) -> dict[str, Any]:
    """The Pod's services, by name, each with its container's spec: the names its open
    wrote in the SERVICES annotation (the API server's, out of the workload's reach),
    each of which must have its container in the Pod's (immutable) spec."""
    annotations: dict[str, str] = pod.metadata.annotations or {}
    listed = annotations.get(SERVICES, "")
    containers: dict[str, Any] = {c.name: c for c in pod.spec.containers}
    found: dict[str, Any] = {}
    for name in filter(None, listed.split(",")):
        container = containers.get(service_container(name))
        if container is None:
            raise ProviderError(
                f"Pod {pod.metadata.name}: service {name!r} of annotation {SERVICES} has no "
                f"container {service_container(name)!r}"
            )
        found[name] = container
    return found


def _names(cfg: KubernetesConfig, dns_servers: tuple[IPAddress, ...]) -> dict[str, Any]:
    """The workload resolves as corral does: the harness's aliases, then corral's resolvers
    (without search domains, so a short name means the same to both)."""
    names: dict[str, Any] = {}
    by_address: dict[str, list[str]] = {}
    for host, address in cfg.host_aliases.items():
        by_address.setdefault(address, []).append(host)
    if by_address:
        names["hostAliases"] = [{"ip": a, "hostnames": h} for a, h in by_address.items()]
    if dns_servers:
        names["dnsPolicy"] = "None"
        names["dnsConfig"] = {"nameservers": [str(s) for s in dns_servers]}
    return names


def fatal(pod: Any) -> str | None:
    status: Any = pod.status
    conditions: list[Any] = status.conditions or []
    containers: list[Any] = [
        *(status.init_container_statuses or []),
        *(status.container_statuses or []),
    ]
    for condition in conditions:
        unscheduled = condition.type == "PodScheduled" and condition.status == "False"
        if unscheduled and condition.reason == "Unschedulable":
            return f"Pod cannot be scheduled: {condition.message}"
    specs: list[Any] = [*(pod.spec.init_containers or []), *pod.spec.containers]
    images: dict[str, str] = {c.name: c.image for c in specs}
    for container in containers:
        state: Any = container.state
        image = images.get(container.name, container.image)
        service = _service_of(container.name)
        of = f"service {service!r}: " if service else ""
        waiting: Any = state.waiting if state else None
        if waiting is not None and waiting.reason in FATAL_WAITING:
            return f"{of}{waiting.reason} for image {image!r}: {waiting.message or ''}".strip()
        terminated: Any = state.terminated if state else None
        if terminated is not None:
            if container.name == INIT_CONTAINER:
                if terminated.exit_code == 0:
                    continue
                needs = "probe_image must hold /bin/busybox (static)"
            elif container.name == probe.CONTAINER:
                needs = "probe_image must keep running by its own entrypoint"
            elif service:
                needs = "a service must keep running (its image's entrypoint or its command)"
            else:
                needs = "a plan.command must keep running (and be on the image's PATH)"
            return (
                f"{of}container {container.name} exited with code {terminated.exit_code} "
                f"({terminated.reason}); {needs}"
            )
    if status.phase == "Failed" and status.reason == "SysctlForbidden":
        return (
            f"the kubelet refuses the sysctls that turn IPv6 off in the Pod ({status.message}); "
            f"start it with {KUBELET_FLAG}, or set disable_ipv6=False where the CNI polices IPv6"
        )
    if status.phase in ("Failed", "Succeeded"):
        return f"Pod ended in phase {status.phase}: {status.reason or ''} {status.message or ''}"
    return None


def _service_of(container: str) -> str | None:
    return container.removeprefix(SERVICE_PREFIX) if container.startswith(SERVICE_PREFIX) else None


async def wait_running(clients: Api, namespace: str, name: str) -> Any:
    """Poll until every container runs; raise at once with the real cause if one never will.

    Each poll reads the Pod as plain JSON: the client's decoding into its models holds the
    GIL for milliseconds a read, which hundreds of opens at once pay on the event loop's
    time. The Pod is decoded once it runs, or when it may have failed (`fatal` decides).
    A read that light can come often: a Pod found running up to POLL_MAX_S after it runs
    adds that much to every open."""
    delay = 0.05
    while True:
        pod = await idempotent(clients.tokens, _read_settled, clients.core, name, namespace)
        if pod is not None:
            cause = fatal(pod)
            if cause is not None:
                error = ConfigError if "image" in cause else ProviderError
                raise error(f"sandbox Pod {name}: {cause}")
            if running(pod):
                return pod
        await anyio.sleep(delay)
        delay = min(delay * 2, POLL_MAX_S)


def _read_settled(core: Api, name: str, namespace: str) -> Any:
    """The Pod, decoded in the worker thread that read it, once `_settled`; else None."""
    response: Any = core.read_namespaced_pod(name, namespace, _preload_content=False)
    text: str = response.data.decode()
    if not _settled(json.loads(text)):
        return None
    return core.api_client.deserialize(text, "V1Pod", "application/json")


def _settled(pod: Any) -> bool:
    """Whether a Pod read as JSON is worth decoding: every container runs, or something
    `fatal` reports may have happened (a superset of it: `fatal` has the last word)."""
    status: Any = pod.get("status") or {}
    if status.get("phase") in ("Failed", "Succeeded"):
        return True
    conditions: list[Any] = status.get("conditions") or []
    if any(c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conditions):
        return True
    statuses: list[Any] = status.get("containerStatuses") or []
    inits: list[Any] = status.get("initContainerStatuses") or []
    for container in [*inits, *statuses]:
        state: Any = container.get("state") or {}
        done: Any = state.get("terminated")
        if done is not None and (container.get("name") != INIT_CONTAINER or done.get("exitCode")):
            return True
        waiting: Any = state.get("waiting") or {}
        if waiting.get("reason") in FATAL_WAITING:
            return True
    spec: Any = pod.get("spec") or {}
    containers: list[Any] = spec.get("containers") or []
    return (
        status.get("phase") == "Running"
        and len(statuses) == len(containers)
        and all("running" in (c.get("state") or {}) for c in statuses)
    )


def running(pod: Any) -> bool:
    """Whether the Pod runs, every container of its spec with it."""
    statuses: list[Any] = pod.status.container_statuses or []
    return (
        pod.status.phase == "Running"
        and len(statuses) == len(pod.spec.containers)
        and all(s.state and s.state.running for s in statuses)
    )


def dns_servers(pod: Any) -> tuple[IPAddress, ...]:
    """The resolvers its manifest gave the Pod (none when it left DNS to the cluster)."""
    config: Any = pod.spec.dns_config
    if pod.spec.dns_policy != "None" or config is None:
        return ()
    servers: list[str] = config.nameservers or []
    return tuple(ipaddress.ip_address(s) for s in servers)


def opened(pod: Any) -> bool:
    """Whether a corral open finished this Pod: running, the sandbox container ready, and
    marked opened by that open (an annotation only the API server's clients can write)."""
    annotations: dict[str, str] = pod.metadata.annotations or {}
    statuses: list[Any] = pod.status.container_statuses or []
    ready = any(s.name == CONTAINER and s.ready for s in statuses)
    deleting = pod.metadata.deletion_timestamp is not None
    return running(pod) and ready and not deleting and annotations.get(OPENED) == "true"


def operation_timeout(pod: Any) -> float | None:
    """The exec default its open recorded; an annotation that does not parse is refused."""
    annotations: dict[str, str] = pod.metadata.annotations or {}
    value = annotations.get(OPERATION_TIMEOUT)
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        raise ProviderError(
            f"Pod {pod.metadata.name}: annotation {OPERATION_TIMEOUT}={value!r} is not a number"
        ) from None
