from __future__ import annotations

import logging
import time
from contextlib import AsyncExitStack

import anyio
import pytest

from corral import (
    ENVIRONMENTS,
    BaseEnvironment,
    ConfigError,
    EnvironmentSession,
    ExecutionPlan,
    NetworkPolicyUnsupported,
    StartupTimeout,
    Timeouts,
)
from corral.core import environment
from corral.core.blocking import limiter, run_blocking
from tests.unit.fakes import FakeEnvironment

pytestmark = pytest.mark.anyio


def test_open_and_close_are_final() -> None:
    with pytest.raises(TypeError, match="final"):

        class Sneaky(BaseEnvironment):  # pyright: ignore[reportUnusedClass]
            id = "sneaky"

            async def open(self, plan: ExecutionPlan) -> EnvironmentSession:  # type: ignore[override]
                raise AssertionError

            async def _open(
                self, plan: ExecutionPlan, owned: AsyncExitStack, *, session_id: str | None
            ) -> EnvironmentSession:
                raise AssertionError


async def test_close_unwinds_exactly_what_open_created() -> None:
    env = FakeEnvironment(steps=3)
    session = await env.open(ExecutionPlan())
    assert len(env.live) == 3
    await env.close(session)
    assert env.live == set()
    await env.close(session)  # idempotent
    assert session.closed


@pytest.mark.parametrize("step", [0, 1, 2, 3])
async def test_failure_at_any_step_leaves_nothing(step: int) -> None:
    env = FakeEnvironment(steps=4, fail_at=step)
    with pytest.raises(RuntimeError, match=f"step {step} failed"):
        await env.open(ExecutionPlan())
    assert env.live == set()


@pytest.mark.parametrize("step", [0, 1, 2])
async def test_cancellation_at_any_step_leaves_nothing(step: int) -> None:
    env = FakeEnvironment(steps=3, hang_at=step)
    with anyio.move_on_after(0.2) as scope:
        await env.open(ExecutionPlan())
    assert scope.cancelled_caught
    assert env.live == set()


async def test_startup_deadline_is_enforced_and_named() -> None:
    env = FakeEnvironment(steps=3, hang_at=1)
    plan = ExecutionPlan(timeouts=Timeouts(startup_s=0.2))
    with pytest.raises(StartupTimeout, match=r"startup_s=0\.2"):
        await env.open(plan)
    assert env.live == set()


async def test_close_under_cancellation_still_unwinds() -> None:
    env = FakeEnvironment(steps=3)
    session = await env.open(ExecutionPlan())
    with anyio.CancelScope() as scope:
        scope.cancel()
        await env.close(session)
    assert env.live == set()


class _ThreadedUndo(FakeEnvironment):
    """Its last resource is removed by a call in a worker thread, one token wide, after
    `own_work_s` of the undo's own work."""

    def __init__(self, own_work_s: float) -> None:
        super().__init__(steps=1)
        self.own_work_s = own_work_s

    async def _open(
        self, plan: ExecutionPlan, owned: AsyncExitStack, *, session_id: str | None
    ) -> EnvironmentSession:
        session = await super()._open(plan, owned, session_id=session_id)
        self.live.add("threaded")

        async def undo() -> None:
            await anyio.sleep(self.own_work_s)
            await run_blocking("unit-undo", 1, self.live.discard, "threaded")

        owned.push_async_callback(undo)
        return session


async def test_a_close_queued_for_a_worker_thread_past_the_bound_still_finishes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Thousands of closes at once queue for a few threads; the wait is not the backend
    being stuck, and a bound that counted it gave every close of 5,000 up."""
    monkeypatch.setattr(environment, "CLEANUP_TIMEOUT_S", 0.3)
    env = _ThreadedUndo(own_work_s=0.0)
    session = await env.open(ExecutionPlan())

    async def hold_the_only_token() -> None:
        await run_blocking("unit-undo", 1, time.sleep, 0.8)

    async with anyio.create_task_group() as group:
        group.start_soon(hold_the_only_token)
        await anyio.sleep(0.05)  # the other call holds the only token
        await env.close(session)
    assert env.live == set()


async def test_a_close_whose_own_work_passes_the_bound_gives_up_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(environment, "CLEANUP_TIMEOUT_S", 0.3)
    env = _ThreadedUndo(own_work_s=30.0)
    session = await env.open(ExecutionPlan())
    started = time.monotonic()
    with caplog.at_level(logging.ERROR, "corral.environment"):
        await env.close(session)
    assert time.monotonic() - started < 2.0
    assert env.live == {"threaded"}
    assert "cleanup exceeded" in caplog.text


async def test_a_close_queued_past_the_ceiling_gives_up_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A shielded close must end: a queue that never moves (every token held by calls
    that do not return) is not waited for beyond the ceiling."""
    monkeypatch.setattr(environment, "CLEANUP_TIMEOUT_S", 0.3)
    monkeypatch.setattr(environment, "CLEANUP_CEILING_S", 0.6)
    env = _ThreadedUndo(own_work_s=0.0)
    session = await env.open(ExecutionPlan())

    async def hold_the_only_token() -> None:
        await run_blocking("unit-undo", 1, time.sleep, 3.0)

    took = 0.0
    async with anyio.create_task_group() as group:
        group.start_soon(hold_the_only_token)
        await anyio.sleep(0.05)
        started = time.monotonic()
        with caplog.at_level(logging.ERROR, "corral.environment"):
            await env.close(session)
        took = time.monotonic() - started
    assert took < 1.5
    assert env.live == {"threaded"}
    assert "cleanup exceeded" in caplog.text


async def test_open_limiter_bounds_concurrency() -> None:
    env = FakeEnvironment(steps=5)
    sessions: list[EnvironmentSession] = []

    async def one() -> None:
        sessions.append(await env.open(ExecutionPlan()))

    async with anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(one)
    assert env.max_seen == FakeEnvironment.max_concurrent_opens
    for s in sessions:
        await env.close(s)
    assert env.live == set()


async def test_unsupported_policy_fails_before_anything_is_created() -> None:
    env = ENVIRONMENTS.create("local")
    plan = ExecutionPlan(network={"baseline": "allowlist:example.com"})  # type: ignore[arg-type]
    with pytest.raises(NetworkPolicyUnsupported, match=r"'baseline'.*allowlist.*supports"):
        await env.open(plan)


def test_registry_lists_and_creates() -> None:
    assert {"local", "docker", "k8s"} <= set(ENVIRONMENTS.ids())
    env = ENVIRONMENTS.create("local", owner="team-a")
    assert env.config.owner == "team-a"
    with pytest.raises(ConfigError, match="'nope'"):
        ENVIRONMENTS.create("nope")


def test_registry_rejects_bad_config_keys() -> None:
    with pytest.raises(ValueError, match="no_such_field"):
        ENVIRONMENTS.create("local", no_such_field=1)
    with pytest.raises(ValueError, match="root_dir"):
        ENVIRONMENTS.create("local", root_dir="/definitely/not/here")


def test_register_checks_ids() -> None:
    with pytest.raises(ConfigError, match="BaseEnvironment"):
        ENVIRONMENTS.register(int)  # type: ignore[arg-type]


async def test_limiters_of_one_name_keep_their_own_token_counts() -> None:
    assert limiter("test:workers", 2).total_tokens == 2
    assert limiter("test:workers", 5).total_tokens == 5
    assert limiter("test:workers", 2) is limiter("test:workers", 2)
