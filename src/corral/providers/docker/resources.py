"""Creating and removing the session's engine objects by exact identity.

An undo is registered *before* each create call, keyed by the object's unique name and
checked against the session label before anything is removed, so a create that is
interrupted half-way (cancellation in the worker thread) can never leak.
"""

from __future__ import annotations

import contextlib
import ipaddress
import random
from typing import Any

from docker.errors import APIError, NotFound
from docker.types import IPAMConfig, IPAMPool

from corral.core.labels import OWNER, SESSION
from corral.errors import ProviderError
from corral.providers.docker.engine import Engine

ROLE = "corral.role"

#: Subnets handed out by this process and not yet released.
_reserved: set[ipaddress.IPv4Network] = set()


def network_name(session_id: str) -> str:
    return f"corral-{session_id}"


def holder_name(session_id: str) -> str:
    return f"corral-{session_id}-holder"


def pooled_holder_name(session_id: str) -> str:
    """The holder's name while its pair waits in a warm pool; claiming renames it."""
    return f"corral-{session_id}-pooled"


def net_name(session_id: str) -> str:
    """The container that owns the sandbox's namespace under a gateway (`gateway`)."""
    return f"corral-{session_id}-net"


def sandbox_name(session_id: str) -> str:
    return f"corral-{session_id}-sandbox"


def programs_volume(session_id: str) -> str:
    """The volume of corral's programs for the sandbox (see `corral.providers.docker.programs`)."""
    return f"corral-{session_id}-programs"


async def live_pair(
    engine: Engine, owner: str, session_id: str
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The inspected holder and sandbox of `owner`'s session `session_id`; None unless both
    run under their names and exact labels, the sandbox in the holder's namespace or, under
    a gateway, in that of the session's net container (in the holder's PID namespace)."""
    selector = [f"{OWNER}={owner}", f"{SESSION}={session_id}"]
    listed: list[dict[str, Any]] = await engine.idempotent(
        engine.api.containers, filters={"label": selector}
    )
    by_name = {item["Names"][0].lstrip("/"): item["Id"] for item in listed}
    pair: list[dict[str, Any]] = []
    for role, name in (("holder", holder_name(session_id)), ("sandbox", sandbox_name(session_id))):
        try:
            info: dict[str, Any] = await engine.idempotent(
                engine.api.inspect_container, by_name[name]
            )
        except (KeyError, NotFound):
            return None
        if not _runs_as(info, owner, session_id, role):
            return None
        pair.append(info)
    holder, sandbox = pair
    joined = sandbox["HostConfig"].get("NetworkMode")
    if joined == f"container:{holder['Id']}":
        return holder, sandbox
    # Under a gateway: the namespace of the session's net container, in the holder's PIDs.
    net = by_name.get(net_name(session_id))
    if net is None or joined != f"container:{net}":
        return None
    try:
        owner_of_ns: dict[str, Any] = await engine.idempotent(engine.api.inspect_container, net)
    except NotFound:
        return None
    if not _runs_as(owner_of_ns, owner, session_id, "net"):
        return None
    if owner_of_ns["HostConfig"].get("PidMode") != f"container:{holder['Id']}":
        return None
    return holder, sandbox


def _runs_as(info: dict[str, Any], owner: str, session_id: str, role: str) -> bool:
    """Whether the inspected container runs, labelled as `role` of `owner`'s session."""
    labels: dict[str, str] = info["Config"].get("Labels") or {}
    expected = {OWNER: owner, SESSION: session_id, ROLE: role}
    return all(labels.get(k) == v for k, v in expected.items()) and info["State"]["Running"]


def _owned_by(labels: dict[str, str] | None, session_id: str) -> bool:
    return (labels or {}).get(SESSION) == session_id


async def remove_container(engine: Engine, name: str, session_id: str) -> None:
    try:
        info: dict[str, Any] = await engine.idempotent(engine.api.inspect_container, name)
    except NotFound:
        return
    if not _owned_by(info["Config"].get("Labels"), session_id):
        raise ProviderError(f"container {name!r} is not session {session_id}'s; left alone")
    await discard_container(engine, info["Id"])


async def discard_container(engine: Engine, container_id: str) -> None:
    """Remove a container by id and return once it is gone.

    A container whose lifetime just ended is already removing itself (auto-remove): the
    engine refuses a second removal (409), so this waits for that one instead.
    """
    try:
        await engine.idempotent(engine.api.remove_container, container_id, force=True, v=True)
    except NotFound:
        return
    except APIError as exc:
        if exc.status_code != 409:
            raise
        with contextlib.suppress(NotFound):
            await engine.call(engine.api.wait, container_id, condition="removed")


async def remove_network(engine: Engine, name: str, session_id: str) -> None:
    """Remove the session's network, by name or (where names may repeat) by id."""
    try:
        info: dict[str, Any] = await engine.idempotent(engine.api.inspect_network, name)
    except NotFound:
        return
    if not _owned_by(info.get("Labels"), session_id):
        raise ProviderError(f"network {name!r} is not session {session_id}'s; left alone")
    with contextlib.suppress(NotFound):
        await engine.idempotent(engine.api.remove_network, info["Id"])


async def create_volume(engine: Engine, name: str, labels: dict[str, str]) -> None:
    try:
        await engine.call(engine.api.create_volume, name, labels=labels)
    except APIError as exc:
        raise ProviderError(f"creating volume {name!r} failed: {exc}") from None


async def remove_volume(engine: Engine, name: str, session_id: str) -> None:
    """Remove the session's volume `name`, once no container of the session holds it."""
    try:
        info: dict[str, Any] = await engine.idempotent(engine.api.inspect_volume, name)
    except NotFound:
        return
    if not _owned_by(info.get("Labels"), session_id):
        raise ProviderError(f"volume {name!r} is not session {session_id}'s; left alone")
    with contextlib.suppress(NotFound):
        await engine.idempotent(engine.api.remove_volume, name, force=True)


def release_subnet(subnet: ipaddress.IPv4Network) -> None:
    """Let this process hand `subnet` out again."""
    _reserved.discard(subnet)


def pick_subnet(pool: str, prefix: int) -> ipaddress.IPv4Network:
    block = ipaddress.IPv4Network(pool)
    count = 2 ** (prefix - block.prefixlen)
    for _ in range(64):
        index = random.randrange(count)
        size = 2 ** (32 - prefix)
        subnet = ipaddress.IPv4Network((int(block.network_address) + index * size, prefix))
        if subnet not in _reserved:
            _reserved.add(subnet)
            return subnet
    raise ProviderError(f"address_pool {pool} has no free /{prefix} left in this process")


async def create_network(
    engine: Engine,
    name: str,
    labels: dict[str, str],
    subnet: ipaddress.IPv4Network,
    subnet6: ipaddress.IPv6Network | None = None,
) -> dict[str, Any]:
    """A bridge of its own for one sandbox: bridges are isolated from each other."""
    pools = [IPAMPool(subnet=str(subnet), gateway=str(next(subnet.hosts())))]
    if subnet6 is not None:
        pools.append(IPAMPool(subnet=str(subnet6), gateway=str(subnet6[1])))
    ipam = IPAMConfig(pool_configs=pools)
    try:
        created: dict[str, Any] = await engine.call(
            engine.api.create_network,
            name,
            driver="bridge",
            ipam=ipam,
            labels=labels,
            check_duplicate=True,
            enable_ipv6=subnet6 is not None,
        )
    except APIError as exc:
        if "overlap" in str(exc).lower():
            raise SubnetTaken(str(subnet)) from None
        if exc.status_code == 409:
            raise NameTaken(name) from None
        raise ProviderError(f"creating network {name!r} failed: {exc}") from None
    return created


def pick_subnet6(pool: str | None) -> ipaddress.IPv6Network | None:
    """A random /64 of `pool` (collisions surface as SubnetTaken and are retried)."""
    if pool is None:
        return None
    block = ipaddress.IPv6Network(pool)
    index = random.randrange(2 ** (64 - block.prefixlen))
    return ipaddress.IPv6Network((int(block.network_address) + (index << 64), 64))


class SubnetTaken(Exception):
    """Another engine user holds this subnet; pick another."""


class NameTaken(Exception):
    """An object of this name exists. The engine checks network names only against the
    networks it has finished creating: two creates at once may both succeed."""
