"""`inspect sandbox cleanup corral`, Inspect's own command: a provider that is not
configured or does not answer (no kubeconfig, no Docker engine) is skipped with one line
saying why, the rest are cleaned, and the command succeeds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

INSPECT = Path(sys.executable).parent / "inspect"


def test_cleanup_skips_providers_it_cannot_reach_and_succeeds(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "KUBECONFIG": str(tmp_path / "no-such-kubeconfig"),
        "DOCKER_HOST": "unix:///nonexistent",
        # `local`'s session records: this test's own, empty.
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    done = subprocess.run(
        [str(INSPECT), "sandbox", "cleanup", "corral"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stdout.splitlines()
    assert "docker: skipped, its engine does not answer" in lines
    k8s = [line for line in lines if line.startswith("k8s: skipped, ")]
    assert len(k8s) == 1 and "Kubernetes credentials" in k8s[0], done.stdout
