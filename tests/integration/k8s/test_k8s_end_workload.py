"""A phase's processes end with the phase on k8s: nothing the agent started during `run`
lives on into `evaluation` or the restored `baseline`, as seen by corral's reaper."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from corral import EnvironmentSession, ExecutionPlan, NetworkSchedule, TaskRun
from corral.errors import WorkloadNotStopped
from corral.providers.k8s import KubernetesEnvironment
from corral.providers.k8s.channel import ChannelExecutor
from corral.providers.k8s.session import KubernetesSession
from tests.integration.k8s.conftest import TEST_IMAGE, make_env
from tests.integration.leftovers import LAUNCH, start_loops

pytestmark = pytest.mark.anyio

COUNTERS = "/tmp/corral-counters"
# From root, one more: a loop as an unprivileged user.
AS_USER = {"setpriv": 'setpriv --reuid=1000 --regid=1000 --init-groups setsid sh -c "$L" {c} &'}
# The trusted view of the process table: the kernel's /proc of the sandbox's PID
# namespace, listed from a reaper container (without killing anything).
LIVE = """
for dir in /proc/[0-9]*; do
  pid=${dir#/proc/}
  [ "$pid" = $$ ] && continue
  read -r stat 2>/dev/null <"$dir/stat" || continue
  set -- ${stat##*") "}
  [ "$1" = Z ] || [ "$1" = X ] || [ "$2" = $$ ] || printf '%s ' "$pid"
done >/dev/termination-log
"""


async def counters(session: EnvironmentSession, names: list[str]) -> dict[str, int]:
    sizes = await session.exec(["wc", "-c", *names], cwd=COUNTERS)
    assert sizes.ok, sizes.stderr
    found = {name: int(size) for size, name in (line.split() for line in sizes.stdout.splitlines())}
    return {name: found[name] for name in names}


async def live_pids(session: KubernetesSession) -> set[int]:
    code, listed = await session.reaper.run(LIVE)
    assert code == 0, listed
    return {int(pid) for pid in listed.split()}


@pytest.mark.parametrize(
    ("overrides", "uids"),
    [
        ({}, {**dict.fromkeys(LAUNCH, "0"), "setpriv": "1000"}),
        ({"run_as_user": 1000}, dict.fromkeys(LAUNCH, "1000")),
    ],
    ids=["root", "non-root"],
)
async def test_nothing_from_the_run_phase_survives_into_evaluation(
    namespace: str, overrides: dict[str, Any], uids: dict[str, str]
) -> None:
    names = list(uids)
    schedule = NetworkSchedule.model_validate(
        {"baseline": "public", "run": "no-network", "evaluation": "public"}
    )
    seen: dict[str, object] = {}

    async def evaluation(session: EnvironmentSession) -> None:
        assert isinstance(session, KubernetesSession)
        seen["live"] = await live_pids(session)
        before = await counters(session, names)
        await anyio.sleep(1)
        after = await counters(session, names)
        seen["advanced"] = {k for k in names if after[k] != before[k]}

    env = make_env(namespace, **overrides)
    async with TaskRun(env, ExecutionPlan(image=TEST_IMAGE, network=schedule)) as run:
        async with run.running() as session:
            assert isinstance(session, KubernetesSession)
            shared = await session.exec(f"mkdir -p {COUNTERS} && chmod 1777 {COUNTERS}")
            assert shared.ok, shared.stderr
            launch = {**LAUNCH, **AS_USER}
            started = await session.exec(start_loops({n: launch[n] for n in names}, COUNTERS))
            assert started.ok, started.stderr
            first = await counters(session, names)
            await anyio.sleep(1)
            running = await counters(session, names)
            assert all(running[k] > first[k] for k in names), (first, running)
            owners: dict[int, str] = {}
            for name in names:
                pid, uid = (await session.read_text(f"{COUNTERS}/{name}.pid")).split()
                assert uid == uids[name], name
                owners[int(pid)] = name
            assert set(owners) <= await live_pids(session)
        await run.evaluate(evaluation)
        assert seen["live"] == {1}, f"alive in evaluation besides PID 1: {seen['live']}"
        assert seen["advanced"] == set()
        restored = await counters(run.session, names)
        await anyio.sleep(1)
        assert await counters(run.session, names) == restored
        # Besides PID 1, only the exec channel's helper that corral started afresh for
        # the evaluation's execs (the run phase's helper died with the run).
        assert await live_pids(session) - channel_helper(session) == {1}


def channel_helper(session: KubernetesSession) -> set[int]:
    """The pid of the exec channel's running helper, if there is one."""
    executor = session.executor
    channel = executor.channel if isinstance(executor, ChannelExecutor) else None
    return {int(channel.hello["pid"])} if channel is not None and channel.dead is None else set()


async def test_a_sandbox_that_can_ptrace_gets_no_verdict(namespace: str) -> None:
    """With CAP_SYS_PTRACE the sandbox could forge the reaper's report: closed instead."""
    security = {"capabilities": {"drop": ["ALL"], "add": ["KILL"]}}
    env: KubernetesEnvironment = make_env(
        namespace, security_context=security, unsafe_capabilities=["SYS_PTRACE"]
    )
    session = await env.open(ExecutionPlan(image=TEST_IMAGE))
    try:
        with pytest.raises(WorkloadNotStopped, match="CAP_SYS_PTRACE"):
            await session.end_workload()
        assert session.closed
    finally:
        await env.close(session)


#: a service process started before the phase ends: its pid and start time must stay
SERVICE_PROCESS = "setsid nohup sleep 7777 </dev/null >/dev/null 2>&1 & echo $!"
#: the workload: background processes, a new session, a loop that respawns
WORKLOAD = (
    "nohup sleep 4321 </dev/null >/dev/null 2>&1 & "
    "setsid sh -c 'while :; do sleep 1; done' </dev/null >/dev/null 2>&1 &"
)
# The sandbox container's processes, listed by corral's busybox in a fresh exec.
LISTED = "/.corral/busybox ps -o pid,args"


async def _started(session: KubernetesSession, pid: str, service: str) -> str:
    stat = await session.exec(["cat", f"/proc/{pid}/stat"], service=service)
    assert stat.ok, stat.stderr
    return stat.stdout.rsplit(")", 1)[1].split()[19]  # field 22, its start time


def _containers(session: KubernetesSession) -> dict[str, tuple[str, int, bool]]:
    target = session.target
    pod: Any = target.clients.core.read_namespaced_pod(target.pod, target.namespace)
    return {
        s.name: (s.container_id, s.restart_count, s.state.running is not None)
        for s in pod.status.container_statuses
    }


async def test_end_workload_ends_only_the_sandbox_s_processes_on_each_runtime(
    runtime_env: KubernetesEnvironment,
) -> None:
    """Security round 4 (issue 40, 8): under gVisor the reaper's `kill(-1)` ended the probe
    and the services too (exit 137), and reported clean. On runc and runsc alike, only the
    sandbox container's processes end: a service's process lives on with its pid and start
    time, every container keeps running unrestarted, the sandbox still answers."""
    plan = ExecutionPlan.model_validate(
        {
            "image": TEST_IMAGE,
            "services": {"box": {"image": TEST_IMAGE, "command": ["sleep", "infinity"]}},
        }
    )
    async with runtime_env.session(plan) as session:
        assert isinstance(session, KubernetesSession)
        kept = await session.exec(SERVICE_PROCESS, service="box")
        assert kept.ok, kept.stderr
        pid = kept.stdout.strip()
        started = await _started(session, pid, "box")
        assert (await session.exec(WORKLOAD)).ok
        await anyio.sleep(0.5)
        before = await anyio.to_thread.run_sync(_containers, session)
        listed = (await session.exec(LISTED)).stdout
        assert "sleep 4321" in listed and "while :; do sleep" in listed, listed
        await session.end_workload()
        after = await anyio.to_thread.run_sync(_containers, session)
        left = await session.exec(LISTED)
        assert await _started(session, pid, "box") == started
    assert after == before and all(running for _, _, running in after.values()), after
    # PID 1 is corral's idle loop (`while :; do read ...`): the workload's loop sleeps.
    assert left.ok and "sleep 4321" not in left.stdout, left
    assert "while :; do sleep" not in left.stdout, left
