"""Exec round trip of `true` and of a command printing 1 MiB: corral through its exec
channel (the default) and through plain engine execs (`exec_channel=False`), each beside
raw docker-py (exec_create/exec_start/exec_inspect) on the same sandbox, and the `docker
exec` CLI. Issue 14's target: the channel at most 0.25x docker-py's p50."""

from __future__ import annotations

import functools
import subprocess
from typing import Any

from bench.context import Context, timed, timed_sync
from bench.report import Row, ratio_at_most
from bench.stats import summarize
from corral.core.session import EnvironmentSession
from corral.providers.docker import DockerEnvironment
from corral.providers.docker.channel import ChannelExecutor
from corral.providers.docker.session import DockerSession

ONE_MIB = "head -c 1048576 /dev/zero | tr '\\0' a"
COMMANDS = {"true": ["true"], "print 1 MiB": ["sh", "-c", ONE_MIB]}
WARMUP = 5
TARGET = 1.05  # plain engine execs: docker-py's cost plus little
CHANNEL_TARGET = 0.25


def raw_exec(api: Any, container: str, argv: list[str]) -> None:
    exec_id = api.exec_create(container, argv)["Id"]
    api.exec_start(exec_id)
    if api.exec_inspect(exec_id)["ExitCode"] != 0:
        raise RuntimeError(f"raw exec of {argv} failed")


async def corral_exec(session: EnvironmentSession, argv: list[str]) -> None:
    result = await session.exec(argv)
    if result.returncode != 0:
        raise RuntimeError(f"corral exec of {argv} failed: {result.stderr}")


def _floor(medians: dict[tuple[str, str], float], name: str) -> str:
    """For a command with output: what the channel cannot go below, measured in this run.
    Its output still crosses the engine's exec stream (dockerd copies it, framed), which
    costs what docker-py's exec of it costs beyond docker-py's exec of `true`."""
    if name == "true" or ("true", "channel") not in medians:
        return ""
    stream = medians[name, "raw"] - medians["true", "raw"]
    floor = medians["true", "channel"] + stream
    return (
        f"floor: channel `true` {medians['true', 'channel'] * 1e3:.1f} ms + the engine's "
        f"stream of the output (docker-py `{name}` minus `true`) {stream * 1e3:.1f} ms = "
        f"{floor * 1e3:.1f} ms = {floor / medians[name, 'raw']:.2f}x docker-py"
    )


def _cli(container: str, argv: list[str]) -> None:
    subprocess.run(["docker", "exec", container, *argv], check=True, capture_output=True)


async def run(ctx: Context) -> list[Row]:
    rows: list[Row] = []
    plain_env = DockerEnvironment(ctx.env.config.model_copy(update={"exec_channel": False}))
    async with (
        ctx.env.session(ctx.plan()) as session,
        plain_env.session(ctx.plan()) as plain,
    ):
        assert isinstance(session, DockerSession) and isinstance(plain, DockerSession)
        assert isinstance(session.executor, ChannelExecutor), "the channel is the default"
        container = session.sandbox
        medians: dict[tuple[str, str], float] = {}
        for name, argv in COMMANDS.items():
            channel: list[float] = []
            direct: list[float] = []
            raw: list[float] = []
            cli: list[float] = []

            for rep in range(WARMUP + ctx.reps(100)):
                samples = (
                    await timed(functools.partial(corral_exec, session, argv)),
                    await timed(functools.partial(corral_exec, plain, argv)),
                    timed_sync(functools.partial(raw_exec, ctx.raw, container, argv)),
                    timed_sync(functools.partial(_cli, container, argv)),
                )
                if rep >= WARMUP:
                    channel.append(samples[0])
                    direct.append(samples[1])
                    raw.append(samples[2])
                    cli.append(samples[3])
            if session.executor.channel is None:
                note = f"no channel: {session.executor.unavailable}"
                rows.append(Row(f"exec `{name}` (channel)", note=note, met=False))
            else:
                mine, theirs = summarize(channel), summarize(raw)
                medians[name, "channel"], medians[name, "raw"] = mine.median, theirs.median
                rows.append(
                    Row(
                        f"exec `{name}` (channel)",
                        mine,
                        "docker-py",
                        theirs,
                        target=f"p50 ≤ {CHANNEL_TARGET}x docker-py",
                        met=ratio_at_most(mine, theirs, CHANNEL_TARGET),
                        note=_floor(medians, name),
                    )
                )
            mine, theirs = summarize(direct), summarize(raw)
            rows.append(
                Row(
                    f"exec `{name}` (plain)",
                    mine,
                    "docker-py",
                    theirs,
                    target=f"p50 ≤ {TARGET}x docker-py",
                    met=ratio_at_most(mine, theirs, TARGET),
                )
            )
            rows.append(
                Row(
                    f"exec `{name}` (channel)",
                    summarize(channel),
                    "`docker exec` CLI",
                    summarize(cli),
                )
            )
    return rows
