"""A sandbox's whole life: corral open (no-network enforced) → first exec → close, vs raw
docker-py create+start+exec+remove of one container with no enforcement at all; and, as
the floor of corral's design, docker-py making and removing the same three objects corral
makes (a bridge network, a holder, a sandbox in the holder's namespace) with no rules."""

from __future__ import annotations

import secrets
from typing import Any

from bench.context import HOLDER_IMAGE, RAW, TEST_IMAGE, Context, timed, timed_sync
from bench.report import Row, ratio_at_most
from bench.stats import summarize

WARMUP = 1
TARGET = 1.3


def raw_cycle(api: Any) -> None:
    """create+start+exec+remove on the default bridge, as a harness without corral would."""
    container = api.create_container(TEST_IMAGE, ["sleep", "infinity"], labels={RAW: "1"})["Id"]
    try:
        api.start(container)
        exec_id = api.exec_create(container, ["true"])["Id"]
        api.exec_start(exec_id)
        if api.exec_inspect(exec_id)["ExitCode"] != 0:
            raise RuntimeError("raw exec failed")
    finally:
        api.remove_container(container, force=True, v=True)


def objects_cycle(api: Any) -> None:
    """corral's three objects by docker-py: network, holder on it, sandbox joining the
    holder's namespace, an exec, all removed; no rules, probe, events or channel."""
    network, containers = [], []
    try:
        network, containers = make_objects(api)
        exec_id = api.exec_create(containers[-1], ["true"])["Id"]
        api.exec_start(exec_id)
    finally:
        remove_objects(api, network, containers)


def make_objects(api: Any) -> tuple[list[str], list[str]]:
    """corral's three objects by docker-py, started: ([network], [holder, sandbox]); what
    was made is removed if a step fails."""
    labels = {RAW: "1"}
    network = [api.create_network(f"corral-bench-{secrets.token_hex(4)}", labels=labels)["Id"]]
    containers: list[str] = []
    try:
        holder = api.create_container(
            HOLDER_IMAGE,
            ["sleep", "infinity"],
            labels=labels,
            host_config=api.create_host_config(network_mode=network[0], cap_add=["NET_ADMIN"]),
        )["Id"]
        containers.append(holder)
        api.start(holder)
        sandbox = api.create_container(
            TEST_IMAGE,
            ["sleep", "infinity"],
            labels=labels,
            host_config=api.create_host_config(network_mode=f"container:{holder}"),
        )["Id"]
        containers.append(sandbox)
        api.start(sandbox)
    except BaseException:
        remove_objects(api, network, containers)
        raise
    return network, containers


def remove_objects(api: Any, networks: list[str], containers: list[str]) -> None:
    for container in reversed(containers):
        api.remove_container(container, force=True, v=True)
    for network in networks:
        api.remove_network(network)


async def run(ctx: Context) -> list[Row]:
    plan = ctx.plan("no-network")

    async def cycle() -> None:
        async with ctx.env.session(plan) as session:
            await session.exec(["true"])

    corral: list[float] = []
    raw: list[float] = []
    objects: list[float] = []
    for rep in range(WARMUP + ctx.reps(15)):
        samples = (
            await timed(cycle),
            timed_sync(lambda: raw_cycle(ctx.raw)),
            timed_sync(lambda: objects_cycle(ctx.raw)),
        )
        if rep >= WARMUP:
            corral.append(samples[0])
            raw.append(samples[1])
            objects.append(samples[2])
    mine, theirs, floor = summarize(corral), summarize(raw), summarize(objects)
    return [
        Row(
            "open → exec → close, no-network",
            mine,
            "docker-py create+start+exec+remove",
            theirs,
            target=f"p50 ≤ {TARGET}x",
            met=ratio_at_most(mine, theirs, TARGET),
            note=f"floor: docker-py's cycle of corral's three objects is "
            f"{floor.median / theirs.median:.2f}x",
        ),
        Row(
            "open → exec → close, no-network",
            mine,
            "docker-py network + holder + sandbox, no rules (the design's floor)",
            floor,
        ),
    ]
