"""The Docker warm pool on a real engine: hits, exclusivity, draining, refills and gc."""

from __future__ import annotations

import sys
import textwrap
import time
from typing import Any

import anyio
import pytest
from pydantic import SecretStr

from corral import ExecutionPlan
from corral.core.session import EnvironmentSession
from corral.providers.docker.pool import POOL, pool_key
from corral.providers.docker.resources import holder_name
from corral.providers.docker.session import DockerSession
from corral.testing.plugin import EgressTarget
from tests.integration.docker.conftest import HOLDER_IMAGE, HOSTS, TEST_IMAGE, leftovers, make_env

pytestmark = pytest.mark.anyio

PLAN = ExecutionPlan(image=TEST_IMAGE, network="no-network")  # type: ignore[arg-type]


def sandbox_of(session: EnvironmentSession) -> str:
    assert isinstance(session, DockerSession)
    return session.sandbox


def test_pool_key_covers_what_shapes_the_containers() -> None:
    base = ExecutionPlan(image=TEST_IMAGE, env={"TOKEN": SecretStr("a")})
    assert pool_key(base) == pool_key(base.model_copy(update={"tags": ("x",), "task_id": "t"}))
    for update in (
        {"env": {"TOKEN": SecretStr("b")}},
        {"image": "other:1"},
        {"network": "no-network"},
        {"workdir": "/srv"},
        {"command": ["sleep", "9"]},
        {"labels": {"team": "a"}},
    ):
        changed = ExecutionPlan.model_validate({**base.model_dump(), **update})
        assert pool_key(changed) != pool_key(base), update


async def test_warm_open_is_ready_and_enforces_the_baseline(
    engine: Any, owner: str, tcp_targets: list[EgressTarget]
) -> None:
    env = make_env(owner)
    target = tcp_targets[0]
    async with env.warm_pool(PLAN, size_per_key=1) as pool:
        await pool.ready()
        started = time.monotonic()
        session = await env.open(PLAN)
        warm_s = time.monotonic() - started
        try:
            assert pool.hits == 1 and pool.misses == 0
            assert warm_s < 0.5, f"a warm open took {warm_s:.2f} s"
            assert session.policy.network_mode.value == "no-network"
            assert (await session.exec("echo ok")).stdout == "ok\n"
            probe = await session.exec(f"nc -z -w 2 {target.host} {target.port}")
            assert probe.returncode != 0, "no-network let a connection through"
            assert engine.containers.get(holder_name(session.id)).labels[POOL] == pool.id
        finally:
            await env.close(session)
    assert leftovers(engine, owner) == []


async def test_concurrent_opens_never_share_a_pooled_sandbox(engine: Any, owner: str) -> None:
    env = make_env(owner)
    sessions: list[EnvironmentSession] = []

    async def take() -> None:
        sessions.append(await env.open(PLAN))

    async with env.warm_pool(PLAN, size_per_key=3) as pool:
        await pool.ready()
        try:
            async with anyio.create_task_group() as tg:
                for _ in range(6):
                    tg.start_soon(take)
            assert pool.hits == 3 and pool.misses == 3
            assert len({s.id for s in sessions}) == 6
            assert len({sandbox_of(s) for s in sessions}) == 6
            await pool.ready()  # refilled in the background
        finally:
            for session in sessions:
                await env.close(session)
    assert leftovers(engine, owner) == []


async def test_other_plans_open_cold(engine: Any, owner: str) -> None:
    env = make_env(owner)
    other = PLAN.model_copy(update={"env": {"A": "1"}})
    async with env.warm_pool(PLAN, size_per_key=1) as pool:
        await pool.ready()
        async with env.session(other) as session:
            assert (await session.exec("echo $A")).stdout == "1\n"
        assert pool.hits == 0 and pool.misses == 1 and pool.idle() == 1


async def test_leaving_the_pool_drains_it_and_spares_taken_sandboxes(
    engine: Any, owner: str
) -> None:
    env = make_env(owner)
    async with env.warm_pool(PLAN, size_per_key=2) as pool:
        await pool.ready()
        session = await env.open(PLAN)
    assert pool.idle() == 0
    try:
        assert (await session.exec("true")).returncode == 0
        names = leftovers(engine, owner)
        assert len(names) == 4 and all(session.id in n for n in names), names
    finally:
        await env.close(session)
    assert leftovers(engine, owner) == []


async def test_cancelled_pool_leaves_nothing(engine: Any, owner: str) -> None:
    env = make_env(owner)
    with anyio.move_on_after(1.0):
        async with env.warm_pool(PLAN, size_per_key=2) as pool:
            await pool.ready()
    assert leftovers(engine, owner) == []


async def test_stale_pairs_are_replaced(engine: Any, owner: str) -> None:
    env = make_env(owner)
    async with env.warm_pool(PLAN, size_per_key=1, max_idle_s=3) as pool:
        await pool.ready()
        first = set(leftovers(engine, owner))
        await anyio.sleep(3.5)
        await pool.ready()
        second = set(leftovers(engine, owner))
        assert first and second and not first & second
    assert leftovers(engine, owner) == []


_ABANDON = """
import anyio, sys
from corral import ExecutionPlan
from corral.providers.docker import DockerConfig, DockerEnvironment

async def main() -> None:
    env = DockerEnvironment(DockerConfig.model_validate({config!r}))
    plan = ExecutionPlan(image={image!r}, network="no-network")
    async with env.warm_pool(plan, size_per_key=2, max_idle_s={idle}) as pool:
        await pool.ready()
        print("ready", flush=True)
        await anyio.sleep_forever()

anyio.run(main)
"""


async def test_gc_collects_pairs_a_dead_process_left_idle(engine: Any, owner: str) -> None:
    config = {
        "owner": owner,
        "holder_image": HOLDER_IMAGE,
        "pull_policy": "never",
        "extra_hosts": HOSTS,
    }
    idle_s = 8
    script = _ABANDON.format(config=config, image=TEST_IMAGE, idle=idle_s)
    child = await anyio.open_process([sys.executable, "-c", textwrap.dedent(script)])
    try:
        assert child.stdout is not None
        line = await child.stdout.receive()
        assert line.strip() == b"ready"
    finally:
        child.kill()  # no drain: what a crashed harness leaves behind
        await child.wait()
        await child.aclose()
    made_at = time.time()
    assert len(leftovers(engine, owner)) == 8, "two pairs: 2 containers, a network, a volume"
    env = make_env(owner)
    assert await env.gc() == []
    await anyio.sleep(max(0.0, made_at + idle_s + 1 - time.time()))
    removed = await env.gc()
    assert len(removed) == 2 and all("idle pooled sandbox" in r for r in removed)
    assert leftovers(engine, owner) == []


async def test_gc_spares_a_claimed_sandbox_past_its_idle_age(engine: Any, owner: str) -> None:
    env = make_env(owner)
    async with env.warm_pool(PLAN, size_per_key=1, max_idle_s=3) as pool:
        await pool.ready()
        async with env.session(PLAN) as session:
            await anyio.sleep(4.5)
            await make_env(owner).gc()
            assert (await session.exec("echo alive")).stdout == "alive\n"
    assert leftovers(engine, owner) == []
