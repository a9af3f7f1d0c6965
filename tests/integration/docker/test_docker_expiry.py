"""Sandboxes end at their lifetime with no corral process left: the harness was SIGKILLed."""

from __future__ import annotations

import sys
import time
from typing import Any

import anyio
import pytest

from corral import ExecutionPlan, Timeouts
from corral.core.labels import EXPIRES_AT, OWNER
from tests.integration.abandoned_harness import ROOT, kill_harness
from tests.integration.conftest import wait_for
from tests.integration.docker.conftest import (
    TEST_IMAGE,
    containers,
    env_config,
    make_env,
    networks,
)

LIFETIME_S = 8
#: How long past its expires-at label a container may take to be gone.
MARGIN_S = 4


def running(engine: Any, owner: str) -> list[str]:
    """`owner`'s running containers, by name."""
    listed = engine.api.containers(filters={"label": f"{OWNER}={owner}"})
    return [c["Names"][0].lstrip("/") for c in listed]


def expiries(engine: Any, owner: str) -> dict[str, int]:
    """`owner`'s containers by name, with their expires-at."""
    return {name: int(labels[EXPIRES_AT]) for name, labels in containers(engine, owner).items()}


@pytest.mark.anyio
async def test_sandboxes_of_a_killed_harness_end_themselves(engine: Any, owner: str) -> None:
    ids, killed_at = await anyio.to_thread.run_sync(
        kill_harness, "docker", env_config(owner, default_lifetime_s=LIFETIME_S), TEST_IMAGE, 2
    )

    left = expiries(engine, owner)
    roles = ("holder", "sandbox")
    assert set(left) == {f"corral-{sid}-{role}" for sid in ids for role in roles}
    expires = max(left.values())
    await wait_for(lambda: not running(engine, owner), expires + MARGIN_S)
    ended_after = time.monotonic() - killed_at
    print(f"harness killed -> containers ended: {ended_after:.1f} s")
    # The holders removed themselves (the engine removes an auto-removed container a
    # moment after it stops running). A network cannot, and a sandbox is not auto-removed
    # (its restart would race the removal): `corral gc` removes both once expired.
    sandboxes = {f"corral-{sid}-sandbox" for sid in ids}
    await wait_for(lambda: set(containers(engine, owner)) <= sandboxes, time.time() + MARGIN_S)
    assert set(containers(engine, owner)) == sandboxes
    assert set(networks(engine, owner)) == {f"corral-{sid}" for sid in ids}
    gc = await anyio.run_process(
        [sys.executable, "-m", "corral", "gc", "--env", "docker", "-p", f"owner={owner}"],
        cwd=ROOT,
    )
    for sid in ids:
        assert f"removed container corral-{sid}-sandbox" in gc.stdout.decode(), gc.stdout
        assert f"removed network corral-{sid}" in gc.stdout.decode(), gc.stdout
    assert not networks(engine, owner) and not containers(engine, owner)


@pytest.mark.anyio
async def test_a_restarted_sandbox_keeps_its_deadline(engine: Any, owner: str) -> None:
    env = make_env(owner)
    plan = ExecutionPlan(image=TEST_IMAGE, timeouts=Timeouts(max_lifetime_s=10))
    session = await env.open(plan)
    try:
        sandbox = f"corral-{session.id}-sandbox"
        expires = expiries(engine, owner)[sandbox]
        await anyio.sleep(5)
        await session.end_workload()  # restarts the sandbox container
        restarted = time.time()
        ended = await wait_for(lambda: sandbox not in running(engine, owner), expires + 2)
        assert ended < restarted + 10, "the restart started a whole new lifetime"
    finally:
        await env.close(session)


@pytest.mark.anyio
async def test_a_workload_that_stops_its_timer_still_loses_its_network(
    engine: Any, owner: str
) -> None:
    env = make_env(owner)
    plan = ExecutionPlan(image=TEST_IMAGE, timeouts=Timeouts(max_lifetime_s=LIFETIME_S))
    session = await env.open(plan)
    try:
        holder = f"corral-{session.id}-holder"
        expires = expiries(engine, owner)[holder]
        # Root in the sandbox freezes the sleep that would end its container.
        frozen = await session.exec("kill -STOP $(ps -o pid= --ppid 1)", user="0")
        assert frozen.returncode == 0, frozen
        assert "eth0" in (await session.exec(["ip", "-o", "link"])).stdout
        await wait_for(lambda: holder not in containers(engine, owner), expires + MARGIN_S)
        # The holder was out of its reach: the sandbox lives on, with loopback only.
        links = await session.exec(["ip", "-o", "link"])
        assert links.returncode == 0, links
        assert [line.split()[1] for line in links.stdout.splitlines()] == ["lo:"], links
        removed = await env.gc()
        assert f"container corral-{session.id}-sandbox" in removed, removed
        assert f"network corral-{session.id}" in removed, removed
    finally:
        await env.close(session)
