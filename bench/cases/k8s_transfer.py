"""upload_dir and download_dir of the transfer tree (2,000 files / 50 MB) vs `kubectl cp`
into and out of the same Pod, alternating repetition by repetition.

`kubectl cp` runs `tar` in the sandbox container over an exec stream, as corral does; both
land the tree exactly at the requested root (`kubectl cp DIR pod:/tmp/x` makes /tmp/x the
tree's root, no nesting), and both start from a remote root that does not exist.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import anyio

from bench.context import Context, timed, timed_sync
from bench.report import Row
from bench.stats import summarize
from bench.tree import FILES, LABEL, SAMPLES, tarfile_extract, throughput, workspace_tree
from corral import ExecutionPlan
from corral.core.tarsafe import pack_dir
from corral.providers.k8s import KubernetesEnvironment
from corral.providers.k8s.execution import ExecStream
from corral.providers.k8s.pod import CONTAINER, corral_sh
from corral.providers.k8s.session import KubernetesSession
from corral.providers.k8s.websocket import FRAME, framed

WARMUP = 1
TARGET = "throughput ≥ 1.0x (p50 time ≤ 1.0x)"


def _kubectl_cp(base: list[str], source: str, dest: str) -> None:
    subprocess.run([*base, "cp", "-c", CONTAINER, source, dest], check=True, capture_output=True)


def _tarfile_down(session: KubernetesSession, dest: Path) -> None:
    """Python's own `tarfile` extracting the Pod's archive of the tree, read through the
    same websocket exec as download_dir's (corral's busybox `tar`)."""
    argv = corral_sh('cd "$1" && exec tar -c -f - .', "/tmp/src")
    execution = ExecStream(session.target, argv)
    tarfile_extract((data for name, data in execution if name == "stdout"), dest)


def _upload_pieces(tree: Path, reps: int = 3) -> tuple[float, float]:
    """Two parts of corral's k8s upload_dir, timed alone (medians): packing the tree into
    its spool (the length the Pod's reader is given comes first), and the masking RFC 6455
    asks of a client for every frame it sends, done in Python (`websocket.framed`, as
    `WebSocketTransport` frames stdin). `kubectl cp` streams, and masks in Go."""
    spooled: list[float] = []
    masked: list[float] = []
    for _ in range(reps):
        started = time.perf_counter()
        with tempfile.TemporaryFile() as spool:
            for chunk in pack_dir(tree):
                spool.write(chunk)
            spooled.append(time.perf_counter() - started)
            spool.seek(0)
            started = time.perf_counter()
            while chunk := spool.read(FRAME):
                framed(b"\0", chunk)
            masked.append(time.perf_counter() - started)
    return statistics.median(spooled), statistics.median(masked)


async def _count(session: KubernetesSession, remote: str) -> int:
    found = await session.exec(["sh", "-c", 'find "$1" -type f | wc -l', "sh", remote])
    return int(found.stdout.strip() or 0)


async def transfer_rows(
    ctx: Context, env: KubernetesEnvironment, base: list[str], plan: ExecutionPlan
) -> list[Row]:
    """`base` is kubectl's argv up to the verb (kubeconfig and namespace given)."""
    tree = workspace_tree(ctx)
    down = ctx.workspace / "k8s-down"
    samples: dict[str, list[float]] = {key: [] for key in SAMPLES}
    errors: list[BaseException] = []
    async with env.session(plan) as session:
        assert isinstance(session, KubernetesSession)
        pod = session.target.pod
        await session.upload_dir(tree, "/tmp/src")

        async def extract() -> None:
            await anyio.to_thread.run_sync(_tarfile_down, session, down)

        for rep in range(WARMUP + ctx.reps(7)):
            await session.exec(["rm", "-rf", "/tmp/up", "/tmp/up-cp"])
            taken = {"up": await timed(lambda: session.upload_dir(tree, "/tmp/up"))}
            taken["up-cp"] = timed_sync(lambda: _kubectl_cp(base, str(tree), f"{pod}:/tmp/up-cp"))
            shutil.rmtree(down, ignore_errors=True)
            try:
                taken["down"] = await timed(lambda: session.download_dir("/tmp/src", down))
            except Exception as exc:  # reported in the row, the other samples still count
                errors.append(exc)
            shutil.rmtree(down, ignore_errors=True)
            taken["down-cp"] = timed_sync(lambda: _kubectl_cp(base, f"{pod}:/tmp/src", str(down)))
            landed = sum(1 for p in down.rglob("*") if p.is_file())
            shutil.rmtree(down, ignore_errors=True)
            taken["down-tarfile"] = await timed(extract)
            shutil.rmtree(down, ignore_errors=True)
            if rep < WARMUP:
                # Both ways, both tools: the whole tree, at the root asked for.
                counts = [*[await _count(session, r) for r in ("/tmp/up", "/tmp/up-cp")], landed]
                if counts != [FILES] * 3:
                    raise RuntimeError(f"files landed (up, up-cp, down-cp): {counts}")
                continue
            for key, value in taken.items():
                samples[key].append(value)
    spool_s, mask_s = await anyio.to_thread.run_sync(_upload_pieces, tree)
    rows: list[Row] = []
    for way, name in (("up", "upload_dir"), ("down", "download_dir")):
        theirs = summarize(samples[f"{way}-cp"])
        mine = summarize(samples[way]) if samples[way] else None
        note = f"{throughput(mine)} vs {throughput(theirs)}" if mine else ""
        if mine and way == "up":
            rest = mine.median - spool_s - mask_s
            note += (
                f"; of it, packing the tree into the spool {spool_s:.2f} s and the client's "
                f"websocket masking in Python {mask_s:.2f} s, timed alone: the rest "
                f"{rest:.2f} s = {rest / theirs.median:.2f}x `kubectl cp`"
            )
        if mine and way == "down":
            floor = summarize(samples["down-tarfile"]).median / theirs.median
            note += (
                f"; floor: Python's `tarfile` extracting the same archive through the same "
                f"exec {floor:.2f}x"
            )
        failed = errors if way == "down" else []
        if failed:
            runs = WARMUP + ctx.reps(7)
            note += f"{'; ' if note else ''}failed {len(failed)} of {runs}: {failed[0]!r}"
        rows.append(
            Row(
                f"k8s: {name} {LABEL}",
                mine,
                "`kubectl cp`",
                theirs,
                target=TARGET,
                met=mine is not None and not failed and mine.median <= theirs.median,
                note=note,
            )
        )
    return rows
