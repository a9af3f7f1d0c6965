"""The README's Quickstart runs as written, on `local`."""

from __future__ import annotations

from corral.providers.local.netns import netns_available
from tests.integration.conftest import unavailable
from tests.readme import PRINTED, run_quickstart


def test_the_quickstart_runs_as_written() -> None:
    if not netns_available():
        unavailable("the Quickstart's no-network phases need `unshare --net` (root or userns)")
    done = run_quickstart()
    assert done.returncode == 0, done.stderr
    assert done.stdout == PRINTED
