"""`local` without a writable cgroup: the session's PID namespace keeps every process it
started, whatever the process does, and ending a phase ends them all (the real kernel)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from corral import ExecutionPlan, NetworkPolicyUnsupported, NetworkSchedule
from corral.errors import FeatureUnsupported
from corral.providers.local import LocalEnvironment
from corral.providers.local import cgroup as local_cgroup
from corral.providers.local import environment as local_environment
from corral.providers.local.pidns import SessionPidNamespace, pidns_available
from corral.providers.local.session import LocalSession
from tests.integration.conftest import unavailable
from tests.integration.leftovers import LAUNCH, start_loops

pytestmark = pytest.mark.anyio

# A loop in a PID (and user) namespace of its own, nested in the session's.
NESTED = {"nested-pidns": "unshare --user --map-current-user --pid --fork " + LAUNCH["setsid"]}


@pytest.fixture(autouse=True)
def no_cgroup(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host as a user who is not root sees it: no cgroup corral may write."""
    if not pidns_available():
        unavailable("a user + PID namespace (`unshare --user --pid`) needs user namespaces")
    monkeypatch.setattr(local_cgroup, "_hierarchy", lambda: Path("/proc/1"))


@pytest.fixture
def counting() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="corral-counters-"))
    yield path
    shutil.rmtree(path)


def counters(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in directory.iterdir() if p.suffix != ".pid"}


async def test_ending_a_phase_ends_every_process_the_session_started(counting: Path) -> None:
    async with LocalEnvironment().session(ExecutionPlan()) as session:
        assert isinstance(session, LocalSession)
        processes = session.tree
        assert isinstance(processes, SessionPidNamespace), processes
        holder = processes.holder
        started = await session.exec(start_loops(LAUNCH | NESTED, str(counting)))
        assert started.ok, started.stderr
        assert len(counters(counting)) == len(LAUNCH) + len(NESTED)
        # A loop's pid is as its own namespace numbers it; the session sees host pids,
        # one per loop at least.
        assert len(processes.alive()) >= len(LAUNCH) + len(NESTED)
        await session.end_workload()
        assert not processes.alive()
        settled = counters(counting)
        await anyio.sleep(0.5)
        assert counters(counting) == settled
        # The phase after has a fresh namespace of its own, and runs.
        assert processes.holder != holder
        assert (await session.exec("echo ok")).stdout == "ok\n"


async def test_a_switch_is_refused_while_a_process_of_the_old_policy_lives(
    counting: Path,
) -> None:
    schedule = NetworkSchedule(baseline="public", run="no-network", evaluation="public")
    env = LocalEnvironment()
    if not env.network_capabilities().dynamic:
        unavailable("switching on local needs a network namespace (`unshare --net`)")
    session = await env.open(ExecutionPlan(network=schedule))
    try:
        assert isinstance(session, LocalSession)
        started = await session.exec(start_loops(NESTED, str(counting)))
        assert started.ok, started.stderr
        with pytest.raises(NetworkPolicyUnsupported, match="live on"):
            await session.set_network_policy("no-network")
        # Refused with the network still open: fail closed, so the session is gone, and
        # with it what it left running.
        assert session.closed
        settled = counters(counting)
        await anyio.sleep(0.5)
        assert counters(counting) == settled
    finally:
        await env.close(session)


async def test_with_neither_cgroup_nor_namespace_ending_a_phase_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refused() -> SessionPidNamespace:
        raise FeatureUnsupported("no user namespaces here")

    monkeypatch.setattr(local_environment.SessionPidNamespace, "start", refused)
    async with LocalEnvironment().session(ExecutionPlan()) as session:
        assert (await session.exec("echo ok")).stdout == "ok\n"
        with pytest.raises(FeatureUnsupported, match="cgroup v2.*no user namespaces"):
            await session.end_workload()
