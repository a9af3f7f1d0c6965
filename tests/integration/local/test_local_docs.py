"""Every Python block of README and docs that is not marked a fragment or for another
provider runs as written on `local` and prints what the text after it says."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.providers.local.netns import netns_available
from tests.integration.conftest import unavailable
from tests.readme import Block, run_block, runnable

RUNNABLE = runnable("local")


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.where for b in RUNNABLE])
def test_the_block_runs_and_prints_what_it_says(block: Block, tmp_path: Path) -> None:
    if not netns_available():
        unavailable("the blocks' no-network phases need `unshare --net` (root or userns)")
    run_block(block, tmp_path)
