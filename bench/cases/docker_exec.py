"""Exec round trip of `true` and of a command printing 1 MiB, in one sandbox: corral vs
raw docker-py (exec_create/exec_start/exec_inspect) vs the `docker exec` CLI."""

from __future__ import annotations

import functools
import subprocess
from typing import Any

from bench.context import Context, timed, timed_sync
from bench.report import Row, ratio_at_most
from bench.stats import summarize
from corral.core.session import EnvironmentSession
from corral.providers.docker.session import DockerSession

ONE_MIB = "head -c 1048576 /dev/zero | tr '\\0' a"
COMMANDS = {"true": ["true"], "print 1 MiB": ["sh", "-c", ONE_MIB]}
WARMUP = 5
TARGET = 1.05


def raw_exec(api: Any, container: str, argv: list[str]) -> None:
    exec_id = api.exec_create(container, argv)["Id"]
    api.exec_start(exec_id)
    if api.exec_inspect(exec_id)["ExitCode"] != 0:
        raise RuntimeError(f"raw exec of {argv} failed")


async def corral_exec(session: EnvironmentSession, argv: list[str]) -> None:
    result = await session.exec(argv)
    if result.returncode != 0:
        raise RuntimeError(f"corral exec of {argv} failed: {result.stderr}")


def _cli(container: str, argv: list[str]) -> None:
    subprocess.run(["docker", "exec", container, *argv], check=True, capture_output=True)


async def run(ctx: Context) -> list[Row]:
    rows: list[Row] = []
    async with ctx.env.session(ctx.plan()) as session:
        assert isinstance(session, DockerSession)
        container = session.sandbox
        for name, argv in COMMANDS.items():
            corral: list[float] = []
            raw: list[float] = []
            cli: list[float] = []

            for rep in range(WARMUP + ctx.reps(100)):
                samples = (
                    await timed(functools.partial(corral_exec, session, argv)),
                    timed_sync(functools.partial(raw_exec, ctx.raw, container, argv)),
                    timed_sync(functools.partial(_cli, container, argv)),
                )
                if rep >= WARMUP:
                    corral.append(samples[0])
                    raw.append(samples[1])
                    cli.append(samples[2])
            mine, theirs = summarize(corral), summarize(raw)
            target = f"p50 ≤ {TARGET}x docker-py"
            met = ratio_at_most(mine, theirs, TARGET)
            rows.append(Row(f"exec `{name}`", mine, "docker-py", theirs, target=target, met=met))
            rows.append(Row(f"exec `{name}`", mine, "`docker exec` CLI", summarize(cli)))
    return rows
