"""The plan's services on Docker: one container each, in the holder's network namespace.

A service joins the holder's namespace as the sandbox does (`network_mode=container:`), so
it and the sandbox reach each other on localhost and every rule the holder enforces (the
baseline, each switch, the fail-closed fallback, the probes' verdicts) covers it with no
rule of its own. It is hardened as the sandbox is (every capability dropped but the safe
set, `no-new-privileges`, never NET_ADMIN or NET_RAW, the same runtime and pids limit,
its resources mapped the same way); it gets none of the sandbox's opt-ins (unsafe
capabilities, mounts). It runs as its image's user, and so do execs in it by default.

It is created only after the baseline is in force, and it is not auto-removed: a service
that exits stays until `close()` (or `corral gc`, by its labels), so `open()` can say why.
It does not end by itself at the session's `corral.expires-at` (the holder and sandbox do):
`corral gc` removes it then.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from docker.errors import APIError, NotFound
from docker.types import DeviceRequest

from corral.core.labels import OWNER, SESSION
from corral.core.plan import Resources, ServiceSpec
from corral.core.redact import plain_env, redact, secret_values
from corral.errors import ProviderError
from corral.providers.docker.config import DockerConfig
from corral.providers.docker.engine import Engine
from corral.providers.docker.resources import ROLE, remove_container

#: label naming the service a container runs
SERVICE = "corral.service"
#: label on every object of a session with services: their names, comma-separated
SERVICES = "corral.services"
#: lines of an exited service's output quoted in the error
QUOTED_LINES = 20


def service_container_name(session_id: str, service: str) -> str:
    return f"corral-{session_id}-svc-{service}"


def resource_limits(resources: Resources, cfg: DockerConfig) -> dict[str, Any]:
    """Host-config limits for `resources`, the config's defaults standing in for unset
    cpu and memory (the sandbox's and each service's alike)."""
    cpu = resources.cpu or cfg.default_cpu
    memory = resources.memory_mb or cfg.default_memory_mb
    return {
        "mem_limit": f"{memory}m" if memory else None,
        "nano_cpus": int(cpu * 1e9) if cpu else None,
        "device_requests": [DeviceRequest(count=resources.gpus, capabilities=[["gpu"]])]
        if resources.gpus
        else None,
        "storage_opt": {"size": f"{resources.disk_mb}M"} if resources.disk_mb else None,
    }


@dataclass(frozen=True)
class ContainerSpec:
    """What the engine is asked to create for one service (no engine needed to make it)."""

    name: str
    image: str
    command: list[str] | None
    labels: dict[str, str]
    working_dir: str | None
    host: dict[str, Any]
    """`create_host_config` keyword arguments"""
    environment: dict[str, str] = field(repr=False)
    """plain values, secrets included: never logged or shown"""


def service_container(
    session_id: str,
    name: str,
    spec: ServiceSpec,
    holder_id: str,
    labels: dict[str, str],
    cfg: DockerConfig,
) -> ContainerSpec:
    host = {
        "network_mode": f"container:{holder_id}",
        "cap_drop": ["ALL"],
        "cap_add": list(cfg.capabilities) or None,
        "security_opt": ["no-new-privileges"],
        "init": True,
        "pids_limit": cfg.pids_limit,
        "runtime": cfg.runtime,
        **resource_limits(spec.resources, cfg),
    }
    return ContainerSpec(
        name=service_container_name(session_id, name),
        image=spec.image,
        command=list(spec.command) if spec.command is not None else None,
        labels={**labels, ROLE: "service", SERVICE: name},
        working_dir=spec.workdir,
        host=host,
        environment=plain_env(spec.env),
    )


async def start_service(
    engine: Engine, spec: ContainerSpec, service: ServiceSpec, session_id: str
) -> dict[str, Any]:
    """Create and start `spec`; the inspected running container, or a ProviderError
    naming the service (its secret env values masked). The caller has pushed the undo."""
    try:
        await engine.call(
            engine.api.create_container,
            spec.image,
            spec.command,
            name=spec.name,
            labels=spec.labels,
            environment=spec.environment,
            working_dir=spec.working_dir,
            host_config=engine.api.create_host_config(**spec.host),
        )
        await engine.call(engine.api.start, spec.name)
    except APIError as exc:
        raise ProviderError(
            redact(
                f"starting service {spec.labels[SERVICE]!r} of sandbox {session_id} from image "
                f"{spec.image!r} failed: {exc.explanation or exc}",
                secret_values(service.env),
            )
        ) from None
    return await running_service(engine, spec.name, service, session_id)


async def running_service(
    engine: Engine, container: str, service: ServiceSpec, session_id: str
) -> dict[str, Any]:
    """The inspected service container, or a ProviderError naming the service with its
    exit code and last output (secret env values masked) if it is not running."""
    info: dict[str, Any] = await engine.idempotent(engine.api.inspect_container, container)
    if info["State"].get("Running"):
        return info
    try:
        raw: bytes = await engine.call(engine.api.logs, container, tail=QUOTED_LINES)
        output = raw.decode("utf-8", errors="replace").strip()
    except APIError:
        output = ""
    name = info["Config"]["Labels"].get(SERVICE, container)
    raise ProviderError(
        redact(
            f"service {name!r} of sandbox {session_id} (image {service.image!r}) exited "
            f"(code {info['State'].get('ExitCode', 'unknown')})"
            + (f"; its last output: {output}" if output else ""),
            secret_values(service.env),
        )
    )


async def find_services(
    engine: Engine, owner: str, session_id: str, holder_id: str
) -> dict[str, dict[str, Any]]:
    """The inspected service containers of `owner`'s session, by service name: those
    carrying its exact labels in the holder's namespace, running or not."""
    selector = [f"{OWNER}={owner}", f"{SESSION}={session_id}", f"{ROLE}=service"]
    listed: list[dict[str, Any]] = await engine.idempotent(
        engine.api.containers, all=True, filters={"label": selector}
    )
    found: dict[str, dict[str, Any]] = {}
    for item in listed:
        item_labels: dict[str, str] = item.get("Labels") or {}
        name = item_labels.get(SERVICE, "")
        if item["Names"][0].lstrip("/") != service_container_name(session_id, name):
            continue
        try:
            info: dict[str, Any] = await engine.idempotent(engine.api.inspect_container, item["Id"])
        except NotFound:
            continue
        if info["HostConfig"].get("NetworkMode") == f"container:{holder_id}":
            found[name] = info
    return found


def service_names(labels: dict[str, str]) -> tuple[str, ...]:
    """The session's services, from the label every one of its objects carries."""
    return tuple(name for name in labels.get(SERVICES, "").split(",") if name)


async def remove_services(engine: Engine, labels: dict[str, str]) -> None:
    """Remove the services of the session whose objects carry `labels`, by exact name."""
    sid = labels[SESSION]
    for name in service_names(labels):
        await remove_container(engine, service_container_name(sid, name), sid)
