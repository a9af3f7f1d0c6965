"""`inspect sandbox cleanup corral`, Inspect's own command: a provider that is not
configured or does not answer (no kubeconfig, no Docker engine) is skipped with one line
saying why, the rest are cleaned, and the command succeeds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.integration.k8s.conftest import cluster as cluster
from tests.integration.k8s.conftest import kubeconfig

INSPECT = Path(sys.executable).parent / "inspect"


def cleanup(tmp_path: Path, kubeconfig: str) -> list[str]:
    """The lines of a successful `inspect sandbox cleanup corral` with no Docker engine."""
    env = {
        **os.environ,
        "KUBECONFIG": kubeconfig,
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
    return done.stdout.splitlines()


def test_cleanup_skips_providers_it_cannot_reach_and_succeeds(tmp_path: Path) -> None:
    lines = cleanup(tmp_path, str(tmp_path / "no-such-kubeconfig"))
    assert "docker: skipped, its engine does not answer" in lines
    k8s = [line for line in lines if line.startswith("k8s: skipped, ")]
    assert len(k8s) == 1 and "Kubernetes credentials" in k8s[0], lines


@pytest.mark.k8s
def test_cleanup_on_a_cluster_without_corrals_namespace_says_so(
    tmp_path: Path, cluster: Any
) -> None:
    try:
        cluster.core.read_namespace("corral")
        has_namespace = True
    except ApiException:
        has_namespace = False
    lines = cleanup(tmp_path, kubeconfig())
    if has_namespace:  # a cluster of corral's: its gc ran
        assert not any(line.startswith("k8s: skipped") for line in lines), lines
    else:
        assert "k8s: skipped, namespace 'corral' does not exist" in "\n".join(lines)
