"""The helper builds, vets and starts processes inside a cgroup with Debian 12's own Go
(1.19: `golang-go` there, what tests/run.sh installs when Go is missing) as well as with
the current one: Go before 1.20 has no clone-into-cgroup, so helper/procs_cgroup_go119.go
joins the cgroup another way, and this keeps that path built and tested."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.integration.conftest import unavailable

ROOT = Path(__file__).resolve().parents[3]
# Where Debian's golang-1.19-go puts it; CORRAL_GO119 names another (an unpacked .deb).
DEBIAN_GO = Path(os.environ.get("CORRAL_GO119", "/usr/lib/go-1.19"))


def _go119() -> dict[str, str]:
    go = DEBIAN_GO / "bin" / "go"
    if not go.is_file():
        unavailable(f"no Go 1.19 at {DEBIAN_GO}: apt-get install golang-1.19-go")
    env = {
        **os.environ,
        "GOROOT": str(DEBIAN_GO),
        "PATH": f"{DEBIAN_GO / 'bin'}:{os.environ['PATH']}",
        "GOTOOLCHAIN": "local",
        "CGO_ENABLED": "0",
    }
    version = subprocess.run(
        ["go", "version"], env=env, capture_output=True, text=True, check=True, timeout=60
    )
    assert "go1.19" in version.stdout, version.stdout
    return env


def _go(env: dict[str, str], *args: str) -> None:
    done = subprocess.run(
        ["go", *args],
        cwd=ROOT / "helper",
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_the_helper_builds_and_runs_in_a_cgroup_with_debian_12s_go(tmp_path: Path) -> None:
    env = _go119()
    for arch in ("amd64", "arm64"):
        _go({**env, "GOOS": "linux", "GOARCH": arch}, "build", "-o", str(tmp_path / arch), ".")
    _go(env, "vet", "./...")
    _go(env, "test", "-count=1", "-run", "TestProcsStartInsideTheCgroup|TestProcsCgroup", ".")
