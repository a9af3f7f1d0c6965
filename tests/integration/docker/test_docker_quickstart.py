"""The README's Quickstart runs on Docker with the one word it says to change, and leaves
nothing behind."""

from __future__ import annotations

from typing import Any

from corral.core.labels import OWNER
from tests.readme import PRINTED, run_quickstart


def test_the_quickstart_runs_on_docker(engine: Any) -> None:
    done = run_quickstart("docker")
    assert done.returncode == 0, done.stderr
    assert done.stdout == PRINTED
    # The Quickstart's owner is the default one; its sandbox is gone.
    listed = engine.api.containers(all=True, filters={"label": f"{OWNER}=corral"})
    assert listed == []
