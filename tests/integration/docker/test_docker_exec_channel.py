"""The exec channel (issue 14) on a real engine: execs really go through one helper, with
the plain path's semantics (users, env, trees killed on timeout and cancellation, bounded
output, concurrency: tests/integration/exec_channel_cases), and plain exec takes over
wherever the helper cannot serve."""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import pytest

from corral import ExecutionPlan
from corral.core.session import ExecRequest
from corral.providers.docker.channel import ChannelExecutor
from corral.providers.docker.session import DockerSession
from corral.testing.engine_faults import EngineFaultProxy
from tests.integration import exec_channel_cases as cases
from tests.integration.docker.conftest import TEST_IMAGE, make_env

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

PLAN = ExecutionPlan(image=TEST_IMAGE)


def _channel(session: object) -> ChannelExecutor:
    assert isinstance(session, DockerSession)
    assert isinstance(session.executor, ChannelExecutor), "the default config uses the channel"
    return session.executor


def _exec_creates(proxy: EngineFaultProxy) -> int:
    return sum(1 for c in proxy.calls if c.method == "POST" and c.route.endswith("/exec"))


async def test_execs_go_through_one_channel(owner: str) -> None:
    with EngineFaultProxy() as proxy:
        env = make_env(owner, base_url=proxy.base_url)
        async with env.session(PLAN) as session:
            first = await session.exec(["echo", "hi"])
            before = _exec_creates(proxy)
            results = [await session.exec(["sh", "-c", f"echo {i}"]) for i in range(20)]
            after = _exec_creates(proxy)
            assert _channel(session).starts == 1
    assert first.stdout == "hi\n"
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(20)]
    assert after == before, f"{after - before} engine execs for 20 commands on the channel"


async def test_the_channel_outlives_a_quiet_spell_longer_than_an_api_call(owner: str) -> None:
    """An agent that thinks for longer than `api_timeout_s` between two commands finds the
    same channel: its stream must not carry the engine client's per-call timeout."""
    env = make_env(owner, api_timeout_s=4)
    async with env.session(PLAN) as session:
        await session.exec(["true"])
        await anyio.sleep(6)
        result = await session.exec(["echo", "still"])
        assert _channel(session).starts == 1
    assert result.stdout == "still\n"


async def test_without_the_channel_each_exec_is_an_engine_exec(owner: str) -> None:
    with EngineFaultProxy() as proxy:
        env = make_env(owner, base_url=proxy.base_url, exec_channel=False)
        async with env.session(PLAN) as session:
            before = _exec_creates(proxy)
            for _ in range(3):
                await session.exec(["true"])
            after = _exec_creates(proxy)
    assert after - before == 3


@pytest.mark.parametrize("broken", ["missing", "cannot-run"])
async def test_a_helper_that_cannot_start_falls_back_to_plain_exec(
    owner: str,
    broken: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    garbage = tmp_path / "corral-exec"
    garbage.write_bytes(b"\x7fELF not a program for any machine" * 10)
    replacement = None if broken == "missing" else garbage

    def binary(arch: str) -> Path | None:
        return replacement

    monkeypatch.setattr("corral.providers.docker.programs.helper_binary", binary)
    caplog.set_level(logging.INFO, logger="corral.docker.channel")
    with EngineFaultProxy() as proxy:
        env = make_env(owner, base_url=proxy.base_url)
        async with env.session(PLAN) as session:
            results = [await session.exec(["sh", "-c", "echo ok; exit 3"]) for _ in range(3)]
            before = _exec_creates(proxy)
            await session.exec(["true"])
            after = _exec_creates(proxy)
            leftovers = await session.exec("ls -a / | grep -c corral-exec || true")
            executor = _channel(session)
    assert [(r.returncode, r.stdout) for r in results] == [(3, "ok\n")] * 3
    assert after - before == 1, "a plain exec per command"
    assert executor.channel is None and executor.unavailable
    warnings = [
        r.getMessage() for r in caplog.records if "exec channel unavailable" in r.getMessage()
    ]
    assert len(warnings) == 1, f"logged once: {warnings}"
    assert ("has no helper for linux/" if broken == "missing" else "helper") in warnings[0]
    assert leftovers.stdout.strip() == "0", "no copy in the sandbox's own filesystem"


@pytest.mark.parametrize("user", [None, "corral"])
async def test_a_timeout_kills_a_double_forked_tree(owner: str, user: str | None) -> None:
    async with make_env(owner).session(PLAN) as session:
        await cases.a_timeout_kills_a_double_forked_tree(session, user)


async def test_output_is_bounded_and_streamed(owner: str) -> None:
    async with make_env(owner, output_limit_bytes=4096).session(PLAN) as session:
        await cases.output_is_bounded_and_streamed(session)


PROBE = (
    'grep -E "^(Uid|Gid|Groups|CapEff|CapBnd|NoNewPrivs)" /proc/self/status; '
    'echo "HOME=$HOME"; pwd; env | grep -v -e ^CORRAL_EXEC= -e ^PWD= | sort; umask'
)


@pytest.mark.parametrize(
    "user",
    [None, "0", "root", "corral", "1000", "1234", "nobody", "corral:root", "65534:65534"],
)
async def test_users_env_and_cwd_match_plain_exec(owner: str, user: str | None) -> None:
    async with make_env(owner).session(PLAN) as session:
        executor = _channel(session)
        request = ExecRequest(("sh", "-c", PROBE), env={"CORRAL_X": "1"}, user=user)
        through = await session.exec(PROBE, env={"CORRAL_X": "1"}, user=user)
        plain = await executor.plain.run(request)
        in_tmp = await session.exec(PROBE, user=user, cwd="/tmp")
        plain_tmp = await executor.plain.run(
            ExecRequest(("sh", "-c", PROBE), user=user, cwd="/tmp")
        )
        assert executor.channel is not None and executor.starts == 1
    assert through.returncode == plain.returncode == 0, (through, plain)
    assert through.stdout == plain.stdout
    assert "CORRAL_X=1" in through.stdout
    assert in_tmp.stdout == plain_tmp.stdout and "\n/tmp\n" in in_tmp.stdout


@pytest.mark.parametrize("case", cases.SESSION_CASES, ids=lambda case: case.__name__)
async def test_exec_channel_case(owner: str, case: cases.SessionCase) -> None:
    async with make_env(owner).session(PLAN) as session:
        await case(session)
