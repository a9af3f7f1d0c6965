"""upload_dir and download_dir of 2,000 files / 50 MB vs `docker cp`, same sandbox; and
the floor of a download extracted in Python: `tarfile` on the same endpoint's archive."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from bench.context import Context, timed, timed_sync
from bench.report import Row
from bench.stats import summarize
from bench.tree import LABEL, SAMPLES, tarfile_extract, throughput, workspace_tree
from corral.providers.docker.session import DockerSession

WARMUP = 1


def _docker_cp(source: str, dest: str) -> None:
    subprocess.run(["docker", "cp", source, dest], check=True, capture_output=True)


def _tarfile_down(api: Any, container: str, dest: Path) -> None:
    """Python's own `tarfile` extracting what download_dir reads, from the same endpoint."""
    chunks, _ = api.get_archive(container, "/tmp/src/.")
    tarfile_extract(chunks, dest)


async def run(ctx: Context) -> list[Row]:
    tree = workspace_tree(ctx)
    down = ctx.workspace / "down"
    samples: dict[str, list[float]] = {key: [] for key in SAMPLES}
    async with ctx.env.session(ctx.plan()) as session:
        assert isinstance(session, DockerSession)
        box = session.sandbox

        async def fresh_remote() -> None:
            await session.exec(["sh", "-c", "rm -rf /tmp/up /tmp/up-cp && mkdir /tmp/up-cp"])

        await session.upload_dir(tree, "/tmp/src")
        for rep in range(WARMUP + ctx.reps(7)):
            await fresh_remote()
            taken = {"up": await timed(lambda: session.upload_dir(tree, "/tmp/up"))}
            taken["up-cp"] = timed_sync(lambda: _docker_cp(f"{tree}/.", f"{box}:/tmp/up-cp"))
            shutil.rmtree(down, ignore_errors=True)
            taken["down"] = await timed(lambda: session.download_dir("/tmp/src", down))
            shutil.rmtree(down, ignore_errors=True)
            down.mkdir()
            taken["down-cp"] = timed_sync(lambda: _docker_cp(f"{box}:/tmp/src/.", str(down)))
            shutil.rmtree(down, ignore_errors=True)
            taken["down-tarfile"] = timed_sync(lambda: _tarfile_down(ctx.raw, box, down))
            shutil.rmtree(down, ignore_errors=True)
            if rep >= WARMUP:
                for key, value in taken.items():
                    samples[key].append(value)
    rows: list[Row] = []
    for way, name in (("up", "upload_dir"), ("down", "download_dir")):
        mine, theirs = summarize(samples[way]), summarize(samples[f"{way}-cp"])
        note = f"{throughput(mine)} vs {throughput(theirs)}"
        if way == "down":
            floor = summarize(samples["down-tarfile"]).median / theirs.median
            note += f"; floor: Python's `tarfile` extracting the same archive {floor:.2f}x"
        rows.append(
            Row(
                f"{name} {LABEL}",
                mine,
                "`docker cp`",
                theirs,
                target="throughput ≥ 1.0x (p50 time ≤ 1.0x)",
                met=mine.median <= theirs.median,
                note=note,
            )
        )
    return rows
