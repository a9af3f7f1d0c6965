"""The base's reattach and fork rules, on an in-memory provider (the real ones are tested
against the engine and the cluster in tests/integration)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import anyio
import pytest

from corral import (
    ConfigError,
    ExecutionPlan,
    FeatureUnsupported,
    NetworkPolicy,
    NetworkSchedule,
    ProviderError,
    SessionNotFound,
    SnapshotRef,
)
from tests.unit.fakes import FakeEnvironment, ReattachableEnvironment, Sandboxes

pytestmark = pytest.mark.anyio


def _ref(provider: str) -> SnapshotRef:
    now = datetime.now(UTC)
    return SnapshotRef(
        provider=provider,
        id="snap1",
        created_at=now,
        source_session="parent",
        expires_at=now + timedelta(hours=1),
    )


async def test_opening_a_live_id_reattaches_with_the_policy_the_provider_holds() -> None:
    sandboxes = Sandboxes()
    first = await ReattachableEnvironment(sandboxes).open(ExecutionPlan(), session_id="task-1")
    await first.set_network_policy("no-network")
    # Another process: a new environment object, and a plan asking for something else.
    plan = ExecutionPlan(network=NetworkSchedule.model_validate("public"))
    other = ReattachableEnvironment(sandboxes)
    again = await other.open(plan, session_id="task-1")
    assert again.id == "task-1"
    assert again.policy == NetworkPolicy.no_network()
    assert sandboxes.creates == 1
    await other.close(again)
    assert sandboxes.policies == {}


async def test_concurrent_opens_of_one_id_make_one_sandbox() -> None:
    sandboxes = Sandboxes()
    ids: list[str] = []

    async def open_one() -> None:
        env = ReattachableEnvironment(sandboxes, open_delay_s=0.3)
        ids.append((await env.open(ExecutionPlan(), session_id="shared")).id)

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(open_one)
    assert ids == ["shared"] * 3
    assert sandboxes.creates == 1


async def test_attach_finds_only_live_ids() -> None:
    sandboxes = Sandboxes()
    env = ReattachableEnvironment(sandboxes)
    with pytest.raises(SessionNotFound, match="'gone'"):
        await env.attach("gone")
    opened = await env.open(ExecutionPlan(), session_id="here")
    attached = await ReattachableEnvironment(sandboxes).attach("here")
    assert attached.id == opened.id and attached.environment is not None


@pytest.mark.parametrize("bad", ["", "UPPER", "-lead", "trail-", "a/b", "x" * 33, "a b"])
async def test_a_session_id_that_cannot_name_a_sandbox_is_refused(bad: str) -> None:
    env = ReattachableEnvironment(Sandboxes())
    with pytest.raises(ConfigError, match="session_id"):
        await env.open(ExecutionPlan(), session_id=bad)
    with pytest.raises(ConfigError, match="session_id"):
        await env.attach(bad)


async def test_providers_without_the_features_say_so() -> None:
    env = FakeEnvironment()
    with pytest.raises(FeatureUnsupported, match="reattach"):
        await env.open(ExecutionPlan(), session_id="abc")
    with pytest.raises(FeatureUnsupported, match="reattach"):
        await env.attach("abc")
    with pytest.raises(FeatureUnsupported, match="snapshot"):
        await env.fork(_ref("fake"), ExecutionPlan())
    session = await env.open(ExecutionPlan())
    with pytest.raises(FeatureUnsupported, match="snapshot"):
        await session.save()
    with pytest.raises(FeatureUnsupported, match="session.start"):
        await session.start(["sleep", "1"])
    with pytest.raises(FeatureUnsupported, match="session.start"):
        await session.shell()
    await env.close(session)
    with pytest.raises(ProviderError, match="closed"):
        await session.save()
    assert env.live == set()
    assert env.features().model_dump() == {
        "provider": "fake",
        "supports_reattach": False,
        "supports_snapshot": False,
        "supports_services": False,
        "supports_network_events": False,
        "supports_processes": False,
        "supports_pty": False,
        "supports_credentials": False,
    }
    assert ReattachableEnvironment.features().supports_reattach


async def test_a_snapshot_of_another_provider_is_refused() -> None:
    class Snapshots(FakeEnvironment):
        supports_snapshot = True

    with pytest.raises(ConfigError, match="'docker'"):
        await Snapshots().fork(_ref("docker"), ExecutionPlan())
