"""Security round 3 on a real cluster: what corral runs in a sandbox Pod (PID 1, the exec
channel's helper, the file calls' commands, a fork's restore) is corral's own bytes from
the read-only programs volume, never the workload's. Each attack here worked against
9645f1b."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral import EnvironmentSession, ExecutionPlan, NetworkPolicy, NetworkSchedule, TaskRun
from corral.core.session import ExecRequest
from corral.errors import TransferLimitExceeded
from corral.providers.k8s.api import Clients
from corral.providers.k8s.channel import ChannelExecutor
from corral.providers.k8s.pod import BUSYBOX, PROGRAMS
from corral.providers.k8s.session import KubernetesSession
from tests.integration.docker.test_docker_own_programs import FORGER
from tests.integration.k8s.conftest import PROBE_IMAGE, TEST_IMAGE, make_env

pytestmark = pytest.mark.anyio

PLAN = ExecutionPlan(image=TEST_IMAGE, workdir="/work")

#: The workload's watcher: puts the forger wherever corral's helper lands, as it lands.
SWAPPER = f"""
import os, time
end = time.time() + 120
while time.time() < end:
    for path in ["/" + n for n in os.listdir("/") if n.startswith(".corral-exec-")] + [
        "{PROGRAMS}/corral-exec"
    ]:
        try:
            os.rename("/tmp/forger-" + str(os.getpid()), path)
        except OSError:
            pass
        try:
            with open("/tmp/forger") as f, open("/tmp/forger-" + str(os.getpid()), "w") as g:
                g.write(f.read())
            os.chmod("/tmp/forger-" + str(os.getpid()), 0o755)
        except OSError:
            pass
"""

#: Wrappers the parent leaves on the image's PATH (/usr/local/sbin, which its snapshot
#: keeps): whatever runs one for corral in the fork leaves a mark.
WRAPPED = ("sh", "tar", "head", "mkdir", "touch", "sleep", "wc", "dd")
WRAPPER = '#!/bin/sh\necho "$0" >> /tmp/revived\nexec /usr/bin/$(/usr/bin/basename "$0") "$@"\n'


def _channel(session: object) -> ChannelExecutor:
    assert isinstance(session, KubernetesSession)
    assert isinstance(session.executor, ChannelExecutor)
    return session.executor


async def test_the_workload_cannot_put_its_own_helper_in_corral_s_place(namespace: str) -> None:
    async with make_env(namespace).session(PLAN) as session:
        executor = _channel(session)
        await session.write_text("/tmp/forger", FORGER)
        await session.write_text("/tmp/swapper.py", SWAPPER)
        started = await session.exec(
            "chmod 755 /tmp/forger && (setsid nohup python3 /tmp/swapper.py >/dev/null 2>&1 &)"
        )
        assert started.returncode == 0, started
        results: list[tuple[int | None, str]] = []
        for _ in range(3):
            # The workload kills its channel's helper: the next call starts a fresh one.
            await executor.plain.run(ExecRequest(("pkill", "-9", "-f", "corral-exec")))
            await anyio.sleep(0.3)
            graded = await session.exec(["sh", "-c", "echo graded; exit 3"])
            results.append((graded.returncode, graded.stdout))
        tried = await executor.plain.run(ExecRequest(("sh", "-c", f"cp /tmp/forger {BUSYBOX}")))
    assert results == [(3, "graded\n")] * 3, results
    assert tried.returncode != 0, "the programs volume is read-only to the sandbox"


async def test_a_fork_runs_none_of_its_parent_s_programs(
    namespace: str, tmp_path: Path, cluster: Any
) -> None:
    owner = f"corral-test-{secrets.token_hex(4)}"
    env = make_env(
        namespace,
        owner=owner,
        snapshot_dir=str(tmp_path),
        snapshot_paths=("/usr/local/sbin", "/work"),
    )
    async with env.session(PLAN) as parent:
        await parent.write_text("/tmp/wrapper", WRAPPER)
        script = "chmod 755 /tmp/wrapper && mkdir -p /work && echo kept > /work/kept && " + (
            " && ".join(f"cp /tmp/wrapper /usr/local/sbin/{name}" for name in WRAPPED)
        )
        made = await parent.exec(["/bin/sh", "-c", script])
        assert made.returncode == 0, made
        ref = await parent.save()
        saved_by = await parent.exec(["/bin/cat", "/tmp/revived"])
    fork = await env.fork(ref, PLAN)
    try:
        await anyio.sleep(1)
        marks = await fork.exec(["/bin/cat", "/tmp/revived"])
        kept = await fork.read_text("/work/kept")
        wrapped = await fork.exec(["/bin/ls", "/usr/local/sbin"])
        pod: Any = cluster.core.read_namespaced_pod(f"corral-{fork.id}", namespace)
    finally:
        await env.close(fork)
    assert saved_by.stdout == "", "saving ran the parent's programs"
    assert marks.stdout == "", f"the fork ran the parent's programs: {marks.stdout!r}"
    assert kept == "kept\n" and "tar" in wrapped.stdout.split(), "the fork has the files"
    sandbox = next(c for c in pod.spec.containers if c.name == "sandbox")
    assert sandbox.command[0] == BUSYBOX, "PID 1 is corral's shell"


async def test_read_text_refuses_a_huge_file(namespace: str) -> None:
    async with make_env(namespace).session(PLAN) as session:
        made = await session.exec("truncate -s 700M /tmp/big")
        assert made.returncode == 0, made
        with pytest.raises(TransferLimitExceeded, match=r"'/tmp/big'.*734003200 bytes.*limit"):
            await session.read_text("/tmp/big")


async def test_every_program_corral_runs_in_the_pod_is_corral_s(
    namespace: str, tmp_path: Path, cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole task (open with its probes, execs plain and timed out, file calls, switches,
    the end of the run with the reaper, evaluation, save, close): every exec corral asks
    the API server for in the sandbox container starts one of corral's read-only programs;
    every other container corral adds runs corral's image."""
    sent: list[tuple[str, list[str]]] = []
    real = Clients.websocket

    def recording(clients: Clients, method: str, *args: Any, **kwargs: Any) -> Any:
        if method == "connect_get_namespaced_pod_exec":
            sent.append((kwargs["container"], list(kwargs["command"])))
        return real(clients, method, *args, **kwargs)

    monkeypatch.setattr(Clients, "websocket", recording)
    schedule = NetworkSchedule(
        baseline=NetworkPolicy.public(),
        run=NetworkPolicy.no_network(),
        evaluation=NetworkPolicy.public(),
    )
    plan = ExecutionPlan(image=TEST_IMAGE, workdir="/work", network=schedule)
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "a.txt").write_text("a")
    env = make_env(namespace, snapshot_dir=str(tmp_path / "snapshots"))
    async with TaskRun(env, plan) as run:
        pod_name = f"corral-{run.session.id}"
        async with run.running() as session:
            await session.exec(["true"])
            await session.exec("echo $HOME")
            assert (await session.exec(["sleep", "5"], timeout=1)).timed_out
            await session.upload_dir(tmp_path / "tree", "/work/tree")
            await session.download_dir("/work/tree", tmp_path / "back")
            await session.write_text("/work/x", "x")
            assert await session.read_text("/work/x") == "x"
            await session.download("/work/x", tmp_path / "x")

        async def grade(session: EnvironmentSession) -> int | None:
            return (await session.exec(["sh", "-c", "exit 3"])).returncode

        assert await run.evaluate(grade) == 3
        await run.session.save()
        pod: Any = cluster.core.read_namespaced_pod(pod_name, namespace)
    in_sandbox = [argv for container, argv in sent if container == "sandbox"]
    assert len(in_sandbox) > 5, in_sandbox
    foreign = [argv for argv in in_sandbox if argv[0] not in (BUSYBOX, f"{PROGRAMS}/corral-exec")]
    assert foreign == []
    assert {c for c, _ in sent} <= {"sandbox", "corral-probe"}, "execs go nowhere else"
    sandbox = next(c for c in pod.spec.containers if c.name == "sandbox")
    assert sandbox.command[0] == BUSYBOX
    ours = [*pod.spec.init_containers, *pod.spec.ephemeral_containers]
    ours += [c for c in pod.spec.containers if c.name == "corral-probe"]
    assert len(pod.spec.ephemeral_containers) >= 1, "the reaper ran"
    assert {c.image for c in ours} == {PROBE_IMAGE}, "corral's containers run corral's image"
    mounts = {
        m.mount_path: m.read_only for m in sandbox.volume_mounts if m.name == "corral-programs"
    }
    assert mounts == {PROGRAMS: True}
