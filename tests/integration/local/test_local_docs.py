"""Every Python block of README and docs that is not marked a fragment runs as written on
`local` and prints what the text after it says."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.providers.local.netns import netns_available
from tests.integration.conftest import unavailable
from tests.readme import Block, python_blocks

RUNNABLE = [b for b in python_blocks() if b.fragment is None]


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.where for b in RUNNABLE])
def test_the_block_runs_and_prints_what_it_says(block: Block, tmp_path: Path) -> None:
    if not netns_available():
        unavailable("the blocks' no-network phases need `unshare --net` (root or userns)")
    done = subprocess.run(
        [sys.executable, "-c", block.code],
        capture_output=True,
        text=True,
        timeout=300,
        # What a block keeps (a snapshot, session records) stays in the test's directory.
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{block.prints}\n"
