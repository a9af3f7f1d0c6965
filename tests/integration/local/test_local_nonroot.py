"""`local` runs a whole `TaskRun`, and the README's Quickstart, for a user who is not
root: the run phase's `no-network` is enforced, what the agent left running dies before
evaluation, and a binding to an absolute path leaves the host directory alone.

The test creates the user, gives it a copy of what the scenario imports (the harness's
own interpreter may sit where that user cannot read), and runs `nonroot/scenario.py` as
that user with the system's Python of the same version.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import unavailable
from tests.readme import PRINTED, quickstart

SCENARIO = Path(__file__).parent / "nonroot" / "scenario.py"
SYSTEM_PYTHON = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
IMPORTS = "import corral, corral.providers.local, corral.workspace, anyio._backends._asyncio"


@pytest.fixture
def user() -> Iterator[pwd.struct_passwd]:
    if os.geteuid() != 0:
        unavailable("creating a test user needs root: run the suite as root")
    if shutil.which("useradd") is None:
        unavailable("no useradd: apt-get install passwd")
    name = f"corral-t{uuid.uuid4().hex[:8]}"
    subprocess.run(
        ["useradd", "--system", "--no-create-home", "--shell", "/bin/sh", name], check=True
    )
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], check=True)


def _library(into: Path) -> Path:
    """What the scenario imports, copied where any user can read it."""
    listed = subprocess.run(
        [
            sys.executable,
            "-c",
            f"{IMPORTS}\nimport sys\n"
            "for name, m in list(sys.modules.items()):\n"
            "    f = getattr(m, '__file__', None)\n"
            "    if '.' not in name and f and ('-packages' in f or name == 'corral'):\n"
            "        print(f)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    lib = into / "lib"
    lib.mkdir()
    for line in listed.stdout.splitlines():
        path = Path(line)
        if path.name == "__init__.py":  # a package: the whole of it
            shutil.copytree(
                path.parent, lib / path.parent.name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy(path, lib / path.name)
    return lib


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory the test user can read (pytest's own tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="corral-nonroot-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.fixture
def server() -> Iterator[int]:
    """A TCP server on the host's loopback; under no-network it must be out of reach."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    listener.close()


def _host_processes_with(marker: str) -> list[int]:
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _run_as(
    user: pwd.struct_passwd, lib: Path, home: Path, args: list[str]
) -> subprocess.CompletedProcess[str]:
    """The system's Python as `user`, with `lib` for its imports and `home` as its home."""
    return subprocess.run(
        [str(SYSTEM_PYTHON), "-P", *args],
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=[],
        env={"PYTHONPATH": str(lib), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home)},
        cwd=home,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_user_who_is_not_root_runs_a_whole_task_run(
    user: pwd.struct_passwd, server: int, shared: Path
) -> None:
    if not SYSTEM_PYTHON.exists():
        unavailable(f"no {SYSTEM_PYTHON} for the test user: apt-get install python3")
    lib = _library(shared)
    scenario = shutil.copy(SCENARIO, shared / SCENARIO.name)
    home = shared / "home"
    home.mkdir()
    host_dir = home / "project"  # a real host directory the binding names
    host_dir.mkdir()
    (host_dir / "precious.txt").write_text("host data\n")
    subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(home)], check=True)
    marker = f"corral-left-{uuid.uuid4().hex}"
    done = _run_as(user, lib, home, [str(scenario), str(server), marker, str(host_dir)])
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["modes"] == ["no-network", "public"], seen
    assert seen["dynamic"] is True, seen
    assert seen["baseline"] == "connected", seen
    assert seen["run_mode"] == "no-network", seen
    assert seen["run"].startswith("refused"), seen
    assert seen["run_uid"] == str(user.pw_uid), "commands keep their own uid under no-network"
    assert seen["background"] == "up", seen
    assert seen["shell"] == f"kept / {user.pw_uid}", seen
    assert seen["background_exit"] == 137, "the run phase's end killed its background process"
    assert seen["evaluation"] == "connected", seen
    assert seen["left_in_sandbox"] == [], "the agent's detached process lived into evaluation"
    assert seen["policy_log"] == ["public", "no-network", "public", "public"], seen
    assert seen["host_dir"] == ["precious.txt"], "the binding emptied the host directory"
    assert seen["synced"] == "bound\nagent\n", seen
    assert _host_processes_with(marker) == [], "the agent's process outlived the session"


def test_the_quickstart_runs_as_written_for_a_user_who_is_not_root(
    user: pwd.struct_passwd, shared: Path
) -> None:
    if not SYSTEM_PYTHON.exists():
        unavailable(f"no {SYSTEM_PYTHON} for the test user: apt-get install python3")
    lib = _library(shared)
    home = shared / "home"
    home.mkdir()
    subprocess.run(["chown", f"{user.pw_uid}:{user.pw_gid}", str(home)], check=True)
    done = _run_as(user, lib, home, ["-c", quickstart()])
    assert done.returncode == 0, done.stderr
    assert done.stdout == PRINTED
