"""The exec channel (issue 14) on a real engine: execs really go through one helper, with
the plain path's semantics (users, env, trees killed on timeout and cancellation, bounded
output, concurrency), and plain exec takes over wherever the helper cannot serve."""

from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral import ExecutionPlan
from corral.core.session import ExecRequest
from corral.errors import ProviderError
from corral.providers.docker.channel import ChannelExecutor
from corral.providers.docker.session import DockerSession
from corral.testing.engine_faults import EngineFaultProxy
from tests.integration.docker.conftest import TEST_IMAGE, make_env

pytestmark = [pytest.mark.docker, pytest.mark.anyio]

PLAN = ExecutionPlan(image=TEST_IMAGE)


def _channel(session: object) -> ChannelExecutor:
    assert isinstance(session, DockerSession)
    assert isinstance(session.executor, ChannelExecutor), "the default config uses the channel"
    return session.executor


def _exec_creates(proxy: EngineFaultProxy) -> int:
    return sum(1 for c in proxy.calls if c.method == "POST" and c.route.endswith("/exec"))


async def _survivors(session: Any, pattern: str) -> str:
    # Through the plain path: nothing the channel did is trusted to show itself gone.
    executor = _channel(session)
    result = await executor.plain.run(
        ExecRequest(("sh", "-c", f"ps -eo args | grep '[{pattern[0]}]{pattern[1:]}' || true"))
    )
    return result.stdout.strip()


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
    assert ("no helper binary" if broken == "missing" else "helper") in warnings[0]
    assert leftovers.stdout.strip() == "0", "no copy in the sandbox's own filesystem"


async def test_cancelling_an_exec_kills_its_tree_and_the_channel_stays(owner: str) -> None:
    nap = 3000 + secrets.randbelow(6000)
    async with make_env(owner).session(PLAN) as session:
        await session.exec(["true"])
        started = anyio.Event()
        began = time.monotonic()

        def seen(stream: str, text: str) -> None:
            started.set()

        async with anyio.create_task_group() as tg:

            async def victim() -> None:
                await session.exec(
                    f"(setsid sh -c 'sleep {nap}' &); sleep {nap} & echo go; wait",
                    on_output=seen,
                )

            tg.start_soon(victim)
            await started.wait()
            await anyio.sleep(0.3)
            began = time.monotonic()
            tg.cancel_scope.cancel()
        took = time.monotonic() - began
        after = await session.exec(["echo", "still here"])
        left = await _survivors(session, f"sleep {nap}")
        assert _channel(session).starts == 1, "the channel survived the cancellation"
    assert took < 1.5, f"the cancellation took {took:.2f} s"
    assert after.stdout == "still here\n"
    assert left == "", f"left running: {left!r}"


@pytest.mark.parametrize("user", [None, "corral"])
async def test_a_timeout_kills_a_double_forked_tree(owner: str, user: str | None) -> None:
    nap = 3000 + secrets.randbelow(6000)
    async with make_env(owner).session(PLAN) as session:
        started = time.monotonic()
        result = await session.exec(
            f"(setsid sh -c 'sleep {nap}' &); (sleep {nap} &); echo started; sleep {nap}",
            timeout=1,
            user=user,
        )
        elapsed = time.monotonic() - started
        await anyio.sleep(0.3)
        left = await _survivors(session, f"sleep {nap}")
        assert _channel(session).starts == 1
    assert result.timed_out and result.returncode == 124
    assert result.stdout == "started\n"
    assert elapsed < 3, f"timeout of 1 s took {elapsed:.1f} s"
    assert left == "", f"left running: {left!r}"


async def test_output_is_bounded_and_streamed(owner: str) -> None:
    chunks: dict[str, list[str]] = {"stdout": [], "stderr": []}
    async with make_env(owner, output_limit_bytes=4096).session(PLAN) as session:
        result = await session.exec(
            "printf HEAD; head -c 300000 /dev/zero | tr '\\0' x; printf TAIL; "
            "printf E >&2; printf 'caf\\303\\251' >&2",
            on_output=lambda stream, text: chunks[stream].append(text),
        )
    assert result.returncode == 0
    assert result.stdout_truncated and not result.stderr_truncated
    assert result.stdout.startswith("HEADxx") and result.stdout.endswith("xxTAIL")
    assert len(result.stdout.encode()) < 4096 + 200
    assert result.stderr == "Ecafé"
    assert "".join(chunks["stdout"]).count("x") == 300000, "on_output sees everything"
    assert "".join(chunks["stderr"]) == "Ecafé"


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


async def test_concurrent_execs_share_one_channel(owner: str) -> None:
    async with make_env(owner).session(PLAN) as session:
        results: dict[int, Any] = {}

        async def one(i: int) -> None:
            results[i] = await session.exec(
                f"sleep 0.5; echo out{i}; echo err{i} >&2; exit {i % 7}",
                stdin=f"in{i}" if i % 2 else None,
            )

        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for i in range(24):
                tg.start_soon(one, i)
        elapsed = time.monotonic() - started
        assert _channel(session).starts == 1
    assert elapsed < 4, f"24 concurrent half-second execs took {elapsed:.1f} s"
    for i, result in results.items():
        assert (result.returncode, result.stdout, result.stderr) == (
            i % 7,
            f"out{i}\n",
            f"err{i}\n",
        )


async def test_end_workload_starts_a_fresh_channel(owner: str) -> None:
    async with make_env(owner).session(PLAN) as session:
        executor = _channel(session)
        await session.exec(["true"])
        first = executor.channel
        await session.end_workload()
        result = await session.exec(["echo", "again"])
        assert executor.starts == 2 and executor.channel is not first
    assert result.stdout == "again\n"


async def test_a_channel_broken_mid_call_raises_and_the_next_call_restarts(owner: str) -> None:
    async with make_env(owner).session(PLAN) as session:
        executor = _channel(session)
        await session.exec(["true"])
        failure: list[BaseException] = []
        raised = anyio.Event()
        took = float("inf")

        async def victim() -> None:
            try:
                await session.exec("sleep 30")
            except ProviderError as exc:
                failure.append(exc)
            raised.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(victim)
            await anyio.sleep(0.5)
            # The workload (root) kills the helper; the plain path does it here.
            began = time.monotonic()
            await executor.plain.run(
                ExecRequest(("sh", "-c", "pkill -9 -f '^/[.]corral/corral-exec'"), user="0")
            )
            with anyio.fail_after(10):
                await raised.wait()
            took = time.monotonic() - began
        after = await session.exec(["echo", "back"])
        left = await _survivors(session, "sleep 30")
        assert executor.starts == 2
    assert "exec channel broke" in str(failure[0])
    assert took < 5
    assert after.stdout == "back\n"
    assert left == "", "the broken call's command was killed through the plain path"
