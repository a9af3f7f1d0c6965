"""upload_dir and download_dir of 2,000 files / 50 MB vs `docker cp`, same sandbox."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from bench.context import Context, timed, timed_sync
from bench.report import Row
from bench.stats import Summary, summarize
from corral.providers.docker.session import DockerSession

FILES = 2000
TOTAL_BYTES = 50 * 1000 * 1000
PER_DIR = 100
WARMUP = 1


def make_tree(root: Path) -> None:
    """2,000 incompressible files in 20 directories, 50 MB in all (made once per run)."""
    size = TOTAL_BYTES // FILES
    for index in range(FILES):
        folder = root / f"d{index // PER_DIR:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"f{index:04d}.bin").write_bytes(os.urandom(size))


def _docker_cp(source: str, dest: str) -> None:
    subprocess.run(["docker", "cp", source, dest], check=True, capture_output=True)


def _throughput(summary: Summary) -> str:
    return f"{TOTAL_BYTES / summary.median / 1e6:.0f} MB/s"


async def run(ctx: Context) -> list[Row]:
    tree = ctx.workspace / "tree"
    if not tree.exists():
        make_tree(tree)
    down = ctx.workspace / "down"
    samples: dict[str, list[float]] = {"up": [], "up-cp": [], "down": [], "down-cp": []}
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
            if rep >= WARMUP:
                for key, value in taken.items():
                    samples[key].append(value)
    rows: list[Row] = []
    for way, name in (("up", "upload_dir"), ("down", "download_dir")):
        mine, theirs = summarize(samples[way]), summarize(samples[f"{way}-cp"])
        rows.append(
            Row(
                f"{name} 2,000 files / 50 MB",
                mine,
                "`docker cp`",
                theirs,
                target="throughput ≥ 1.0x (p50 time ≤ 1.0x)",
                met=mine.median <= theirs.median,
                note=f"{_throughput(mine)} vs {_throughput(theirs)}",
            )
        )
    return rows
