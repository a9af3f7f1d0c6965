"""A phase's processes end with the phase on the local provider: nothing the agent started
during `run` lives on into `evaluation` or the restored `baseline`, as the session's
cgroup (the kernel's view) shows."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from corral import (
    EnvironmentSession,
    ExecutionPlan,
    NetworkPolicyUnsupported,
    NetworkSchedule,
    Process,
    PtySize,
    TaskRun,
)
from corral.providers.local import LocalEnvironment
from corral.providers.local.cgroup import SessionCgroup
from corral.providers.local.session import LocalSession
from tests.integration.conftest import unavailable
from tests.integration.leftovers import LAUNCH, start_loops

pytestmark = pytest.mark.anyio

# The agent runs as the host user corral runs as, and as `nobody`.
USERS = {"": None, "nobody-": "nobody"}


def counters(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in directory.iterdir() if p.suffix != ".pid"}


def uids(directory: Path) -> dict[int, str]:
    """Each loop's pid and the uid it ran as."""
    found = (p.read_text().split() for p in directory.glob("*.pid"))
    return {int(pid): uid for pid, uid in found}


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(") ", 1)[1].split()[0] not in ("Z", "X")


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user can write (the workspace is the host user's alone)."""
    if os.geteuid() != 0:
        unavailable("a session cgroup, and exec(user='nobody'), need corral to run as root")
    path = Path(tempfile.mkdtemp(prefix="corral-counters-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path)


def in_cgroup(session: LocalSession) -> list[str]:
    assert isinstance(session.tree, SessionCgroup), session.tree
    return (session.tree.path / "cgroup.procs").read_text().split()


async def test_nothing_from_the_run_phase_survives_into_evaluation(shared_dir: Path) -> None:
    seen: dict[str, object] = {}

    async def evaluation(session: EnvironmentSession) -> None:
        assert isinstance(session, LocalSession)
        seen["cgroup"] = in_cgroup(session)
        seen["alive"] = [pid for pid in owners if alive(pid)]
        before = counters(shared_dir)
        await anyio.sleep(1)
        seen["advanced"] = {k for k, v in counters(shared_dir).items() if v != before[k]}

    owners: dict[int, str] = {}
    async with TaskRun(LocalEnvironment(), ExecutionPlan()) as run:
        async with run.running() as session:
            assert isinstance(session, LocalSession)
            for prefix, user in USERS.items():
                loops = start_loops(LAUNCH, str(shared_dir), prefix)
                started = await session.exec(loops, user=user)
                assert started.ok, started.stderr
            first = counters(shared_dir)
            await anyio.sleep(1)
            assert all(size > first[k] for k, size in counters(shared_dir).items())
            owners.update(uids(shared_dir))
            assert len(owners) == len(LAUNCH) * len(USERS)
            nobody = str(pwd.getpwnam("nobody").pw_uid)
            assert sorted(set(owners.values())) == sorted({str(os.getuid()), nobody})
            assert all(alive(pid) for pid in owners)
            assert {str(pid) for pid in owners} <= set(in_cgroup(session))
        await run.evaluate(evaluation)
        assert seen["cgroup"] == []
        assert seen["alive"] == []
        assert seen["advanced"] == set()
        restored = counters(shared_dir)
        await anyio.sleep(1)
        assert counters(shared_dir) == restored


async def test_started_processes_end_with_the_run_phase(shared_dir: Path) -> None:
    """What `session.start` and a shell launched (as the host user and as `nobody`,
    detached, renamed, behind a terminal) is in the session's cgroup and dies with the
    run phase, as the kernel shows."""
    seen: dict[str, object] = {}

    async def evaluation(session: EnvironmentSession) -> None:
        assert isinstance(session, LocalSession)
        seen["cgroup"] = in_cgroup(session)
        seen["alive"] = [pid for pid in owners if alive(pid)]
        seen["exits"] = [await proc.wait(timeout=10) for proc in started]

    owners: dict[int, str] = {}
    started: list[Process] = []
    async with TaskRun(LocalEnvironment(), ExecutionPlan()) as run:
        async with run.running() as session:
            assert isinstance(session, LocalSession)
            for prefix, user in USERS.items():
                launcher = await session.start(
                    ["sh", "-c", start_loops(LAUNCH, str(shared_dir), prefix)], user=user
                )
                assert await launcher.wait(timeout=30) == 0
            term = await session.start(["sh"], pty=PtySize())
            await term.write("sleep 3401\n")
            started += [term, await session.start(["sleep", "3402"], user="nobody")]
            async with await session.shell() as shell:
                await shell.run("sleep 3403 &")
            owners.update(uids(shared_dir))
            assert len(owners) == len(LAUNCH) * len(USERS)
            assert {str(pid) for pid in owners} <= set(in_cgroup(session))
        await run.evaluate(evaluation)
    assert seen["cgroup"] == [] and seen["alive"] == []
    assert seen["exits"] == [137, 137], "each handle says its process was killed"


async def test_close_kills_what_the_session_left_running(shared_dir: Path) -> None:
    env = LocalEnvironment()
    session = await env.open(ExecutionPlan())
    assert isinstance(session, LocalSession)
    started = await session.exec(start_loops(LAUNCH, str(shared_dir)))
    assert started.ok, started.stderr
    assert in_cgroup(session) != []
    cgroup = session.tree
    assert isinstance(cgroup, SessionCgroup), cgroup
    await env.close(session)
    assert not cgroup.path.exists()
    settled = counters(shared_dir)
    await anyio.sleep(0.5)
    assert counters(shared_dir) == settled


async def test_a_switch_sees_a_process_that_moved_into_a_child_cgroup(shared_dir: Path) -> None:
    schedule = NetworkSchedule(baseline="public", run="no-network")
    env = LocalEnvironment()
    session = await env.open(ExecutionPlan(network=schedule))
    try:
        assert isinstance(session, LocalSession)
        cgroup = session.tree
        assert isinstance(cgroup, SessionCgroup), cgroup
        # As root, the workload makes a cgroup under its own and moves a loop into it:
        # the session's own cgroup.procs no longer lists it.
        hide = f"mkdir {cgroup.path}/hide; "
        move = f'echo $$ > {cgroup.path}/hide/cgroup.procs && exec sh -c "$0" "$1"'
        launch = hide + f"setsid sh -c '{move}' \"$L\" {{c}} &"
        loop = start_loops({"hidden": launch}, str(shared_dir))
        started = await session.exec(loop)
        assert started.ok, started.stderr
        assert in_cgroup(session) == []
        with pytest.raises(NetworkPolicyUnsupported, match="live on"):
            await session.set_network_policy("no-network")
        assert session.closed
        settled = counters(shared_dir)
        await anyio.sleep(0.5)
        assert counters(shared_dir) == settled
    finally:
        await env.close(session)
