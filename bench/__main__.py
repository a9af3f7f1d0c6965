"""Run every benchmark, print a markdown table, keep the raw JSON in bench/results/last.json.

    uv run --all-extras python -m bench [--quick] [--only CASE ...]

Needs a Docker Engine that answers and the test images (`bash bench/run.sh` starts and
builds them). The engine is reset (everything this run labelled removed) between cases.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import tempfile
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import anyio

from bench.cases import CASES
from bench.context import Context, make_context
from bench.machine import describe, summary_line
from bench.report import Row, markdown
from corral.providers.docker import DockerEnvironment

RESULTS = Path(__file__).parent / "results" / "last.json"


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="a fifth of the repetitions")
    parser.add_argument("--only", nargs="+", choices=sorted(CASES), help="run only these cases")
    parser.add_argument("--output", type=Path, default=RESULTS, help="raw JSON results")
    return parser.parse_args(argv)


@contextlib.contextmanager
def _own_logging() -> Generator[None]:
    """The root logger as it was before a case: a library a case drives (AgentCompass sets
    up a rich handler) must not slow the cases after it. In the 7 Dec full run the kwok
    rows, which come after it, spent most of their loop stalls in that handler."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


async def _run(ctx: Context, names: list[str]) -> list[Row]:
    rows: list[Row] = []
    for name in names:
        await ctx.reset()
        started = time.monotonic()
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        try:
            with _own_logging():
                rows += await CASES[name](ctx)
        except Exception as exc:
            rows.append(Row(name, note=f"failed: {exc!r}"))
        print(f"bench: {name} {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    leftover = await ctx.reset()
    if leftover:
        print(f"bench: removed leftovers {leftover}", file=sys.stderr)
    return rows


def main(argv: list[str]) -> int:
    args = _args(argv)
    if not DockerEnvironment.engine_answers():
        print("bench: no Docker Engine answers; run `bash bench/run.sh`", file=sys.stderr)
        return 2
    names = args.only or list(CASES)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
        ctx = make_context(0.2 if args.quick else 1.0, Path(tmp), args.output.parent)
        machine = describe(ctx.raw)
        started = time.time()
        rows = anyio.run(_run, ctx, names)
    command = "python -m bench " + " ".join(argv)
    print(f"\nMachine: {summary_line(machine)}\nCommand: `{command.strip()}`\n")
    print(markdown(rows))
    result: dict[str, Any] = {
        "command": command.strip(),
        "started_at": started,
        "duration_s": time.time() - started,
        "machine": machine,
        "rows": [row.as_json() for row in rows],
    }
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
