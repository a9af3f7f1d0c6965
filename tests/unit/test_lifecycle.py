from __future__ import annotations

import anyio
import pytest

from corral import EnvironmentSession, ExecutionPlan, NetworkMode, NetworkSchedule, TaskRun
from corral.errors import WorkloadNotStopped
from tests.unit.fakes import FakeEnvironment

pytestmark = pytest.mark.anyio

SCHEDULE = NetworkSchedule(
    baseline="public",  # type: ignore[arg-type]
    run="no-network",  # type: ignore[arg-type]
    evaluation="allowlist:grader.example.com",  # type: ignore[arg-type]
)
PLAN = ExecutionPlan(network=SCHEDULE)


async def test_reused_evaluation_baseline_run_evaluation_baseline() -> None:
    env = FakeEnvironment()
    seen: list[str] = []

    async def grade(session: EnvironmentSession) -> str:
        seen.append(session.policy.network_mode.value)
        return "graded"

    async with TaskRun(env, PLAN) as run:
        async with run.running() as session:
            assert session.policy.network_mode is NetworkMode.NO_NETWORK
        assert run.session.policy.network_mode is NetworkMode.NO_NETWORK  # shutdown under run
        assert await run.evaluate(grade) == "graded"
        sid = run.session.id
        assert run.session.policy.network_mode is NetworkMode.PUBLIC
    assert seen == ["allowlist"]
    assert run.policy_log == [
        (sid, "baseline", "public"),
        (sid, "run", "no-network"),
        (sid, "evaluation", "allowlist"),
        (sid, "baseline", "public"),
    ]
    assert env.live == set()


async def test_the_run_phase_ends_before_evaluation_and_before_the_restore() -> None:
    env = FakeEnvironment()

    async def grade(session: EnvironmentSession) -> None:
        env.calls.append((session.id, "grade"))

    async with TaskRun(env, PLAN) as run:
        async with run.running():
            pass
        await run.evaluate(grade)
        sid = run.session.id
    assert env.calls == [
        (sid, "no-network"),
        (sid, "end_workload"),
        (sid, "allowlist"),
        (sid, "grade"),
        (sid, "end_workload"),
        (sid, "public"),
    ]


async def test_processes_that_survive_stop_the_evaluation_and_close_the_sandbox() -> None:
    env = FakeEnvironment(workload_survives=True)
    graded: list[str] = []

    async def grade(session: EnvironmentSession) -> None:
        graded.append(session.id)

    async with TaskRun(env, PLAN) as run:
        async with run.running():
            pass
        with pytest.raises(WorkloadNotStopped, match="a process survived"):
            await run.evaluate(grade)
        assert run.session.closed
        assert env.live == set()
    assert graded == []
    assert [mode for _, mode in env.calls] == ["no-network", "end_workload"]


async def test_fresh_evaluation_uses_a_second_sandbox() -> None:
    env = FakeEnvironment()
    schedule = SCHEDULE.model_copy(update={"evaluation_baseline": SCHEDULE.run})
    ids: list[str] = []

    async def grade(session: EnvironmentSession) -> None:
        ids.append(session.id)
        assert session.policy.network_mode is NetworkMode.ALLOWLIST

    async with TaskRun(env, ExecutionPlan(network=schedule), fresh_evaluation=True) as run:
        async with run.running():
            pass
        await run.evaluate(grade)
        main = run.session.id
    (evaluation,) = ids
    assert evaluation != main
    assert run.policy_log == [
        (main, "baseline", "public"),
        (main, "run", "no-network"),
        (evaluation, "evaluation_baseline", "no-network"),
        (evaluation, "evaluation", "allowlist"),
        (evaluation, "evaluation_baseline", "no-network"),
    ]
    assert env.live == set()


async def test_exception_in_fn_still_restores() -> None:
    env = FakeEnvironment()

    async def boom(session: EnvironmentSession) -> None:
        raise KeyError("grader broke")

    async with TaskRun(env, PLAN) as run:
        with pytest.raises(KeyError, match="grader broke"):
            await run.evaluate(boom)
        assert run.session.policy.network_mode is NetworkMode.PUBLIC
        assert run.policy_log[-1][1:] == ("baseline", "public")


async def test_cancellation_in_fn_still_restores() -> None:
    env = FakeEnvironment()

    async def hang(session: EnvironmentSession) -> None:
        await anyio.sleep_forever()

    async with TaskRun(env, PLAN) as run:
        with anyio.move_on_after(0.1) as scope:
            await run.evaluate(hang)
        assert scope.cancelled_caught
        assert run.session.policy.network_mode is NetworkMode.PUBLIC


async def test_restore_failure_is_attached_to_the_primary_error() -> None:
    env = FakeEnvironment(fail_modes=frozenset({NetworkMode.PUBLIC}))

    async def boom(session: EnvironmentSession) -> None:
        raise KeyError("primary")

    async with TaskRun(env, PLAN) as run:
        with pytest.raises(KeyError, match="primary") as info:
            await run.evaluate(boom)
    notes = getattr(info.value, "__notes__", [])
    assert any("restoring the 'baseline' policy failed" in n for n in notes)
    assert isinstance(getattr(info.value, "restore_error", None), RuntimeError)


async def test_restore_failure_without_primary_error_is_raised() -> None:
    env = FakeEnvironment(fail_modes=frozenset({NetworkMode.PUBLIC}))

    async def fine(session: EnvironmentSession) -> None:
        return None

    async with TaskRun(env, PLAN) as run:
        with pytest.raises(RuntimeError, match="cannot apply public"):
            await run.evaluate(fine)


async def test_always_allow_is_merged_explicitly(caplog: pytest.LogCaptureFixture) -> None:
    env = FakeEnvironment()
    with caplog.at_level("WARNING", logger="corral.lifecycle"):
        run = TaskRun(env, PLAN, always_allow=["api.example.com:443"])
    assert str(run.schedule.run) == "allowlist:api.example.com:443"
    assert str(run.schedule.evaluation) == "allowlist:grader.example.com,api.example.com:443"
    assert str(run.schedule.baseline) == "public"
    assert "turns no-network into an allowlist" in caplog.text
    async with run, run.running():
        pass
    assert run.policy_log[-1][1:] == ("run", "allowlist")


async def test_the_workload_ends_before_evaluation_and_before_the_restore() -> None:
    env = FakeEnvironment()

    async def grade(session: EnvironmentSession) -> None:
        env.calls.append((session.id, "grading"))

    async with TaskRun(env, PLAN) as run:
        async with run.running():
            pass
        await run.evaluate(grade)
        sid = run.session.id
    assert [step for s, step in env.calls if s == sid] == [
        "no-network",
        "end_workload",
        "allowlist",
        "grading",
        "end_workload",
        "public",
    ]


async def test_a_failed_switch_falls_back_to_no_network() -> None:
    env = FakeEnvironment(fail_modes=frozenset({NetworkMode.ALLOWLIST}))
    async with env.session(PLAN) as session:
        with pytest.raises(RuntimeError) as failure:
            await session.set_network_policy("allowlist:example.com")
        assert session.policy.network_mode is NetworkMode.NO_NETWORK
        assert "the sandbox now has no network" in failure.value.__notes__[-1]
        assert not session.closed


async def test_a_switch_whose_fallback_fails_closes_the_session() -> None:
    env = FakeEnvironment(fail_modes=frozenset({NetworkMode.ALLOWLIST, NetworkMode.NO_NETWORK}))
    async with env.session(PLAN) as session:
        with pytest.raises(RuntimeError) as failure:
            await session.set_network_policy("allowlist:example.com")
        assert session.closed
        assert "the session was closed" in failure.value.__notes__[-1]
    assert env.live == set()


async def test_a_hung_restore_is_bounded_and_attached_to_the_primary_error() -> None:
    env = FakeEnvironment()

    async def grade(session: EnvironmentSession) -> None:
        env.hang_switch = True
        raise ValueError("grader failed")

    async with TaskRun(env, PLAN, restore_timeout_s=0.2) as run:
        async with run.running():
            pass
        with anyio.fail_after(5), pytest.raises(ValueError) as failure:
            await run.evaluate(grade)
    assert isinstance(failure.value.restore_error, TimeoutError)  # type: ignore[attr-defined]
