"""Every Python block of the docs marked `<!-- runs on: docker -->` runs as written on
the Docker Engine, prints what the text after it says, and leaves nothing behind; every
line of a shell block marked `<!-- shell: runs -->` runs as written (the demo picks the
engine when one answers)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from corral.adapters.inspect.config import DEFAULT_OWNER as INSPECT_OWNER
from corral.adapters.minisweagent.config import DEFAULT_OWNER as MINISWEAGENT_OWNER
from corral.adapters.swerex.config import DEFAULT_OWNER as SWEREX_OWNER
from tests.readme import ROOT, Block, docker_leftovers, run_block, runnable, shell_blocks

RUNNABLE = runnable("docker")


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.where for b in RUNNABLE])
def test_the_block_runs_on_docker_and_prints_what_it_says(
    block: Block, engine: Any, tmp_path: Path
) -> None:
    run_block(block, tmp_path)
    # The blocks' owners are the defaults (corral's, and each adapter's for its own).
    owners = ("corral", INSPECT_OWNER, SWEREX_OWNER, MINISWEAGENT_OWNER)
    assert docker_leftovers(engine, *owners) == []


LINES = [
    (where, line)
    for where, how, code in shell_blocks()
    if how is not None and how.startswith("runs")
    for line in code.splitlines()
    # It builds from debian:bookworm-slim, which only a registry serves.
    if "build-holder" not in line
]


@pytest.mark.parametrize(
    ("where", "line"), LINES, ids=[line.split("#")[0].strip() for _, line in LINES]
)
def test_the_shell_line_runs_as_written(where: str, line: str, engine: Any) -> None:
    # The suite's own environment stays as it is (uv run would otherwise sync it).
    env = {**os.environ, "UV_FROZEN": "1"}
    done = subprocess.run(
        ["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, (where, done.stdout, done.stderr)
    assert docker_leftovers(engine, "corral") == []
