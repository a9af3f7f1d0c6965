"""The one build path (`uv build`) makes a wheel that carries what corral advertises: the
exec channel's helper for every architecture it ships, `py.typed`, the license; it
installs into a fresh virtualenv and runs the demo there; without the helper and with no
Go toolchain, the build fails and says how to fix it."""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

from tests.integration.conftest import unavailable

ROOT = Path(__file__).resolve().parents[3]
HELPERS = ("corral/helper/bin/corral-exec-linux-amd64", "corral/helper/bin/corral-exec-linux-arm64")


def _uv() -> str:
    uv = shutil.which("uv")
    if uv is None:
        unavailable("`uv` is not on PATH (python3 -m pip install uv)")
        raise AssertionError
    return uv


def _build(
    source: Path, out: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_uv(), "build", "--out-dir", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )


def test_uv_build_carries_the_helper_and_installs_and_runs(tmp_path: Path) -> None:
    if not all((ROOT / "src" / h).is_file() for h in HELPERS):
        unavailable("the helper is not built here: run `bash helper/build.sh`")
    built = _build(ROOT, tmp_path / "dist")
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert set(HELPERS) <= names, "the sdist-built wheel carries the helper"
    assert "corral/py.typed" in names
    assert any(n.endswith("licenses/LICENSE") for n in names)
    venv = tmp_path / "venv"
    subprocess.run([_uv(), "venv", "--quiet", str(venv)], check=True, timeout=300)
    subprocess.run(
        [
            _uv(),
            "pip",
            "install",
            "--quiet",
            "--python",
            str(venv / "bin" / "python"),
            f"{wheel}[docker]",
        ],
        check=True,
        timeout=600,
    )
    demo = subprocess.run(
        [str(venv / "bin" / "corral"), "demo", "--env", "local"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
    )
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    # What it lists is what this wheel can do: it carries the helper, so Docker offers
    # hostname allowlists and refusal events (tests/unit/test_helper_declared.py: without).
    listed = subprocess.run(
        [str(venv / "bin" / "corral"), "list", "env"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "400"},
        check=True,
    )
    docker = next(line for line in listed.stdout.splitlines() if "│ docker" in line)
    assert "wildcard-hostname" in docker and "network_events" in docker, docker
    # The conformance suite, from the installed wheel, against local.
    subprocess.run(
        [_uv(), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), "pytest"],
        check=True,
        timeout=600,
    )
    (tmp_path / "test_conformance.py").write_text(
        (ROOT / "tests" / "integration" / "local" / "test_local_conformance.py").read_text()
    )
    suite = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        check=False,
    )
    assert suite.returncode == 0, suite.stdout[-3000:]
    assert " passed" in suite.stdout and " failed" not in suite.stdout


def test_a_build_without_the_helper_or_go_fails_saying_how_to_fix_it(tmp_path: Path) -> None:
    source = tmp_path / "src"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(source)], check=True, timeout=120)
    # A PATH with uv and git but no Go toolchain.
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("git", "sh", "bash"):
        found = shutil.which(tool)
        assert found is not None
        (tools / tool).symlink_to(found)
    (tools / "uv").symlink_to(_uv())
    env = {**os.environ, "PATH": str(tools)}
    built = _build(source, tmp_path / "dist", env)
    assert built.returncode != 0
    assert "must carry the exec helper" in built.stderr and "helper/build.sh" in built.stderr
    assert not list(tmp_path.glob("dist/*.whl")), "no wheel without the helper"
