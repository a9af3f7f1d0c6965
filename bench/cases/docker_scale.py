"""What one open costs as live sessions pile up: sessions opened one after another, each
kept open, up to LIVE (300; --quick 30), every open timed against how many were
live; then all closed at once. Beside it, the same with docker-py: corral's three objects
without rules (the floor of a network per session), and one container on one network;
each kept, then removed. The curves go to `scale.png` beside the results."""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any, NamedTuple

import anyio
from docker.types import IPAMConfig, IPAMPool

from bench.cases.docker_open import make_objects, remove_objects
from bench.context import RAW, TEST_IMAGE, Context
from bench.report import Row, ratio_at_most
from bench.stats import Summary, summarize
from corral import EnvironmentSession

LIVE = 300
QUICK_LIVE = 30
#: the opens compared: the first and the last tenth of the curve
TENTH = 10
FLAT = 1.2
#: the baseline's network: room for LIVE containers, clear of the test engine's pools
RAW_SUBNET = "10.212.0.0/20"


class _CorralCurve(NamedTuple):
    opens: list[float]
    #: docker-py's three objects made beside the first and the last `band` live sessions
    beside: tuple[list[float], list[float]]
    closed: float
    failure: str


def _beside(api: Any) -> float:
    """docker-py's three objects made (timed), then removed."""
    started = time.perf_counter()
    network, containers = make_objects(api)
    made = time.perf_counter() - started
    remove_objects(api, network, containers)
    return made


async def _corral_curve(ctx: Context, live: int, band: int) -> _CorralCurve:
    """Open times by live count, docker-py's three objects made beside the first and last
    `band` of them (what the engine asks of any open under corral's live sessions, their
    streams and rules included), seconds to close them all, and the first failure."""
    opens: list[float] = []
    beside: tuple[list[float], list[float]] = ([], [])
    sessions: list[EnvironmentSession] = []
    failure = ""
    try:
        for n in range(live):
            started = time.perf_counter()
            try:
                sessions.append(await ctx.env.open(ctx.plan("no-network")))
            except Exception as exc:
                failure = f"open {len(opens) + 1} failed: {exc!r}"[:300]
                break
            opens.append(time.perf_counter() - started)
            if n < band or n >= live - band:
                beside[n >= band].append(await anyio.to_thread.run_sync(_beside, ctx.raw))
    finally:
        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for session in sessions:
                tg.start_soon(ctx.env.close, session)
        closed = time.perf_counter() - started
    return _CorralCurve(opens, beside, closed, failure)


def _raw_curve(api: Any, live: int) -> list[float]:
    """On a network of its own: the default bridge (a /24 here) holds fewer than LIVE."""
    ipam = IPAMConfig(pool_configs=[IPAMPool(subnet=RAW_SUBNET)])
    name = f"corral-bench-raw-{secrets.token_hex(3)}"
    network = api.create_network(name, labels={RAW: "1"}, ipam=ipam)["Id"]
    host_config = api.create_host_config(network_mode=network)
    opens: list[float] = []
    containers: list[str] = []
    try:
        for _ in range(live):
            started = time.perf_counter()
            container = api.create_container(
                TEST_IMAGE, ["sleep", "infinity"], labels={RAW: "1"}, host_config=host_config
            )["Id"]
            containers.append(container)
            api.start(container)
            opens.append(time.perf_counter() - started)
    finally:
        for container in containers:
            api.remove_container(container, force=True, v=True)
        api.remove_network(network)
    return opens


def _floor_curve(api: Any, live: int) -> list[float]:
    """corral's three objects by docker-py (no rules, probe, events or channel), kept."""
    opens: list[float] = []
    networks: list[str] = []
    containers: list[str] = []
    try:
        for _ in range(live):
            started = time.perf_counter()
            network, pair = make_objects(api)
            networks += network
            containers += pair
            opens.append(time.perf_counter() - started)
    finally:
        remove_objects(api, networks, containers)
    return opens


def draw(curves: dict[str, list[float]], path: Path) -> None:
    """The curves as a PNG at `path` (matplotlib: the bench extra, needed here only)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as typed

    pyplot: Any = typed  # matplotlib's own hints leave its **kwargs unknown
    figure, axes = pyplot.subplots(figsize=(7, 3.5), dpi=100)
    for label, opens in curves.items():
        axes.plot(range(1, len(opens) + 1), opens, ".", markersize=3, label=label)
    axes.set_xlabel("sessions already live + 1")
    axes.set_ylabel("seconds per open")
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    axes.set_title("Docker: one open's cost against live sessions (one engine, 2 cores)")
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)


async def run(ctx: Context) -> list[Row]:
    # --quick stays under its ten minutes: a tenth of the sessions, and docker-py's
    # objects beside corral's left out.
    full = ctx.scale >= 1
    live = LIVE if full else QUICK_LIVE
    band = max(1, live // TENTH)
    beside_band = band if full else 0
    corral, beside, closed, failure = await _corral_curve(ctx, live, beside_band)
    leaked = ctx.leaks()
    await ctx.reset()
    floor = await anyio.to_thread.run_sync(_floor_curve, ctx.raw, live)
    await ctx.reset()
    raw = await anyio.to_thread.run_sync(_raw_curve, ctx.raw, live)
    curves = {
        "corral open, no-network": corral,
        "docker-py network + holder + sandbox, no rules": floor,
        "docker-py create+start": raw,
    }
    draw(curves, ctx.results / "scale.png")

    def ends(opens: list[float]) -> tuple[Summary, Summary]:
        return summarize(opens[:band]), summarize(opens[-band:])

    first, last = ends(corral)
    floor_first, floor_last = ends(floor)
    raw_first, raw_last = ends(raw)
    late = f"{len(corral) - band + 1}-{len(corral)} sessions live"
    near = [summarize(made) for made in beside if made]
    grown = f" and {near[1].median / near[0].median:.2f}x beside corral's" if len(near) == 2 else ""
    beside_rows = (
        [
            Row(
                f"docker-py network + holder + sandbox made beside corral's {late}",
                near[1],
                f"the same beside 1-{band} of corral's",
                near[0],
            )
        ]
        if len(near) == 2
        else []
    )
    return [
        Row(
            f"open with {late}",
            last,
            f"corral open with 1-{band} live",
            first,
            target=f"p50 ≤ {FLAT}x (flat)",
            met=ratio_at_most(last, first, FLAT),
            note=f"scale.png; floor: docker-py's three objects grow "
            f"{floor_last.median / floor_first.median:.2f}x among their own{grown}, "
            f"create+start {raw_last.median / raw_first.median:.2f}x",
        ),
        Row(
            f"docker-py network + holder + sandbox with {late}",
            floor_last,
            f"the same with 1-{band} live",
            floor_first,
        ),
        Row(
            f"docker-py create+start with {late}",
            raw_last,
            f"the same with 1-{band} live",
            raw_first,
        ),
        *beside_rows,
        Row(
            f"{live} live sessions: failed opens",
            summarize([float(live - len(corral))]),
            unit="count",
            target="0",
            met=not failure,
            note=failure,
        ),
        Row(
            f"{len(corral)} live sessions: closed all at once",
            summarize([closed]),
        ),
        Row(
            f"{len(corral)} live sessions: leaked containers + networks",
            summarize([float(len(leaked))]),
            unit="count",
            target="0",
            met=not leaked,
        ),
    ]
