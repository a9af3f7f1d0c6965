"""Exec channel scenarios, run against a real sandbox by the Docker and Kubernetes tests:
execs go through one helper with the plain path's semantics (trees killed on timeout and
cancellation, bounded output, concurrency), and a broken or ended channel is replaced.

Each takes a session of the provider's default config (the channel on) and checks what
is left in the sandbox through the plain path: nothing the channel did is trusted to show
itself gone."""

from __future__ import annotations

import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from corral.core.session import EnvironmentSession, ExecRequest
from corral.errors import ProviderError
from corral.helper.channel import ChannelExecutor


def channel_of(session: EnvironmentSession) -> ChannelExecutor:
    executor: Any = getattr(session, "executor", None)
    assert isinstance(executor, ChannelExecutor), "the default config uses the channel"
    return executor


async def survivors(session: EnvironmentSession, pattern: str) -> str:
    """Command lines in the sandbox matching `pattern`, listed by a plain exec."""
    result = await channel_of(session).plain.run(
        ExecRequest(("sh", "-c", f"ps -eo args | grep '[{pattern[0]}]{pattern[1:]}' || true"))
    )
    return result.stdout.strip()


async def a_timeout_kills_a_double_forked_tree(
    session: EnvironmentSession, user: str | None = None
) -> None:
    nap = 3000 + secrets.randbelow(6000)
    started = time.monotonic()
    result = await session.exec(
        f"(setsid sh -c 'sleep {nap}' &); (sleep {nap} &); echo started; sleep {nap}",
        timeout=1,
        user=user,
    )
    elapsed = time.monotonic() - started
    await anyio.sleep(0.3)
    left = await survivors(session, f"sleep {nap}")
    assert channel_of(session).starts == 1
    assert result.timed_out and result.returncode == 124
    assert result.stdout == "started\n"
    assert elapsed < 3, f"timeout of 1 s took {elapsed:.1f} s"
    assert left == "", f"left running: {left!r}"


async def cancelling_an_exec_kills_its_tree_and_the_channel_stays(
    session: EnvironmentSession,
) -> None:
    nap = 3000 + secrets.randbelow(6000)
    await session.exec(["true"])
    started = anyio.Event()
    began = time.monotonic()

    def seen(stream: str, text: str) -> None:
        started.set()

    async with anyio.create_task_group() as tg:

        async def victim() -> None:
            await session.exec(
                f"(setsid sh -c 'sleep {nap}' &); sleep {nap} & echo go; wait", on_output=seen
            )

        tg.start_soon(victim)
        await started.wait()
        await anyio.sleep(0.3)
        began = time.monotonic()
        tg.cancel_scope.cancel()
    took = time.monotonic() - began
    after = await session.exec(["echo", "still here"])
    left = await survivors(session, f"sleep {nap}")
    assert channel_of(session).starts == 1, "the channel survived the cancellation"
    assert took < 1.5, f"the cancellation took {took:.2f} s"
    assert after.stdout == "still here\n"
    assert left == "", f"left running: {left!r}"


async def output_is_bounded_and_streamed(session: EnvironmentSession) -> None:
    """In a session whose output limit is 4096 bytes."""
    chunks: dict[str, list[str]] = {"stdout": [], "stderr": []}
    result = await session.exec(
        "printf HEAD; head -c 300000 /dev/zero | tr '\\0' x; printf TAIL; "
        "printf E >&2; printf 'caf\\303\\251' >&2",
        on_output=lambda stream, text: chunks[stream].append(text),
    )
    assert channel_of(session).starts == 1
    assert result.returncode == 0
    assert result.stdout_truncated and not result.stderr_truncated
    assert result.stdout.startswith("HEADxx") and result.stdout.endswith("xxTAIL")
    assert len(result.stdout.encode()) < 4096 + 200
    assert result.stderr == "Ecafé"
    assert "".join(chunks["stdout"]).count("x") == 300000, "on_output sees everything"
    assert "".join(chunks["stderr"]) == "Ecafé"


async def concurrent_execs_share_one_channel(session: EnvironmentSession) -> None:
    await session.exec(["true"])
    results: dict[int, Any] = {}

    async def one(i: int) -> None:
        results[i] = await session.exec(
            f"sleep 0.5; cat; echo out{i}; echo err{i} >&2; exit {i % 7}",
            stdin=f"in{i}" if i % 2 else None,
        )

    started = time.monotonic()
    async with anyio.create_task_group() as tg:
        for i in range(24):
            tg.start_soon(one, i)
    elapsed = time.monotonic() - started
    assert channel_of(session).starts == 1
    assert elapsed < 4, f"24 concurrent half-second execs took {elapsed:.1f} s"
    for i, result in results.items():
        stdin = f"in{i}" if i % 2 else ""
        assert (result.returncode, result.stdout, result.stderr) == (
            i % 7,
            f"{stdin}out{i}\n",
            f"err{i}\n",
        )


async def end_workload_starts_a_fresh_channel(session: EnvironmentSession) -> None:
    executor = channel_of(session)
    await session.exec(["true"])
    first = executor.channel
    await session.end_workload()
    result = await session.exec(["echo", "again"])
    helpers = await executor.plain.run(
        ExecRequest(("sh", "-c", "ps -eo args | grep -c '^/[.]corral/corral-exec' || true"))
    )
    assert executor.starts == 2 and executor.channel is not first
    assert result.stdout == "again\n"
    assert helpers.stdout.strip() == "1", "the old helper died with the workload"


async def a_channel_broken_mid_call_raises_and_the_next_call_restarts(
    session: EnvironmentSession,
) -> None:
    executor = channel_of(session)
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
        # The workload (root in the test image) kills the helper; the plain path does here.
        began = time.monotonic()
        await executor.plain.run(ExecRequest(("sh", "-c", "pkill -9 -f '^/[.]corral/corral-exec'")))
        with anyio.fail_after(10):
            await raised.wait()
        took = time.monotonic() - began
    after = await session.exec(["echo", "back"])
    left = await survivors(session, "sleep 30")
    assert executor.starts == 2
    assert "exec channel broke" in str(failure[0])
    assert took < 5
    assert after.stdout == "back\n"
    assert left == "", "the broken call's command was killed through the plain path"


SessionCase = Callable[[EnvironmentSession], Awaitable[None]]

#: the scenarios that take one session of the provider's default config
SESSION_CASES: tuple[SessionCase, ...] = (
    cancelling_an_exec_kills_its_tree_and_the_channel_stays,
    concurrent_execs_share_one_channel,
    end_workload_starts_a_fresh_channel,
    a_channel_broken_mid_call_raises_and_the_next_call_restarts,
)
