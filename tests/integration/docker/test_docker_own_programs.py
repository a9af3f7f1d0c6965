"""Security round 3 on a real engine: everything corral runs inside a Docker sandbox is
corral's own bytes from where a root workload cannot write, and no limit corral enforces
is read from the sandbox's tools. Each attack here worked against 9645f1b."""

from __future__ import annotations

import resource
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from inspect_ai.util import OutputLimitExceededError

from corral import EnvironmentSession, ExecutionPlan, NetworkPolicy, NetworkSchedule, TaskRun
from corral.adapters.inspect.files import read_file
from corral.core.labels import OWNER
from corral.errors import TransferLimitExceeded
from corral.providers.docker import DockerEnvironment
from corral.providers.docker.programs import BUSYBOX, HELPER, MOUNT
from corral.providers.docker.session import ENGINE_INIT, DockerSession
from corral.providers.docker.snapshots import SNAPSHOT
from corral.testing.plugin import EgressTarget
from tests.integration.conftest import ALLOWED_IP, TCP_PORT
from tests.integration.docker.conftest import TEST_IMAGE, leftovers, make_env

pytestmark = pytest.mark.anyio

#: The agent's exec-channel impostor: speaks the helper's protocol and answers every
#: command with exit 0 and "FORGED" (what forged a grader's result on 9645f1b).
FORGER = r"""#!/usr/bin/python3
import json, struct, sys
out, inp = sys.stdout.buffer, sys.stdin.buffer
def send(kind, rid, payload):
    body = bytes([kind]) + struct.pack(">I", rid) + payload
    out.write(struct.pack(">I", len(body)) + body); out.flush()
hello = {"version": 1, "uid": 0, "pid": 1, "can_switch_user": True}
send(ord("H"), 0, json.dumps(hello).encode())
while True:
    head = inp.read(9)
    if len(head) < 9:
        break
    size, kind, rid = struct.unpack(">IBI", head)
    inp.read(size - 5)
    if kind == ord("R"):
        send(ord("o"), rid, b"FORGED by the agent\n")
        send(ord("X"), rid, b'{"code": 0, "killed": false}')
"""

#: Written over /usr/bin/sleep (and /usr/bin/date) during the run: whatever runs it again
#: starts the agent's loop, which dials out, puts the forger wherever corral's helper
#: lives or lived, and then sleeps as asked.
REVIVER = f"""#!/bin/sh
echo "$$ $0" >> /tmp/revived
(
  while :; do
    nc -z -w 1 {ALLOWED_IP} {TCP_PORT} && echo hit >> /tmp/hits
    for f in /.corral-exec-* {HELPER}; do
      [ -f "$f" ] && cp /tmp/forger "$f.x" 2>/dev/null && mv -f "$f.x" "$f" 2>/dev/null
    done
  done
) >/dev/null 2>&1 &
exec /usr/bin/real-"$(basename "$0")" "$@"
"""


async def tamper(sandbox: EnvironmentSession) -> None:
    """As root: the forger in place, `sleep` and `date` replaced by the reviver."""
    await sandbox.write_text("/tmp/forger", FORGER)
    await sandbox.write_text("/tmp/reviver", REVIVER)
    script = (
        "chmod 755 /tmp/forger /tmp/reviver && for t in sleep date; do "
        "cp /usr/bin/$t /usr/bin/real-$t && cp /tmp/reviver /usr/bin/$t; done"
    )
    done = await sandbox.exec(["sh", "-c", script], user="0")
    assert done.returncode == 0, done


async def processes(sandbox: DockerSession) -> list[str]:
    """The sandbox's command lines, from the engine's host-side view."""
    top: dict[str, Any] = await anyio.to_thread.run_sync(sandbox.engine.api.top, sandbox.sandbox)
    column = top["Titles"].index("CMD")
    rows: list[list[str]] = top.get("Processes") or []
    return [row[column] for row in rows]


def corral_s(commands: list[str]) -> bool:
    return all(c.split(" ", 1)[0] in (ENGINE_INIT, BUSYBOX, HELPER) for c in commands)


async def test_the_workload_does_not_come_back_after_its_run_nor_forge_the_grader(
    docker_env: DockerEnvironment, tcp_targets: list[EgressTarget]
) -> None:
    schedule = NetworkSchedule(
        baseline=NetworkPolicy.public(),
        run=NetworkPolicy.no_network(),
        evaluation=NetworkPolicy.public(),
    )
    plan = ExecutionPlan(image=TEST_IMAGE, network=schedule)
    async with TaskRun(docker_env, plan) as run:
        async with run.running() as sandbox:
            await tamper(sandbox)

        async def grade(session: EnvironmentSession) -> dict[str, Any]:
            assert isinstance(session, DockerSession)
            await anyio.sleep(2)  # time for a revived loop to dial out and swap the helper
            graded = await session.exec(["sh", "-c", "echo graded; exit 3"])
            state = await session.exec("cat /tmp/revived /tmp/hits 2>/dev/null; true")
            return {
                "graded": (graded.returncode, graded.stdout),
                "state": state.stdout,
                "processes": await processes(session),
            }

        seen = await run.evaluate(grade)
    assert seen["graded"] == (3, "graded\n"), "the grader's result is the grader's"
    assert seen["state"] == "", "nothing of the workload ran again (no revival, no dial)"
    assert corral_s(seen["processes"]), seen["processes"]


async def test_corral_s_programs_are_read_only_to_root_in_the_sandbox(
    docker_env: DockerEnvironment,
) -> None:
    async with docker_env.session(ExecutionPlan(image=TEST_IMAGE)) as sandbox:
        assert isinstance(sandbox, DockerSession)
        await sandbox.write_text("/tmp/forger", FORGER)
        attacks = {
            "overwrite": f"cp /tmp/forger {HELPER}",
            "replace": f"mv -f /tmp/forger {HELPER}",
            "remove": f"rm -f {BUSYBOX}",
            "remount": f"mount -o remount,rw {MOUNT}",
            "unmount": f"umount -l {MOUNT}",
            "cover": f"mount -t tmpfs none {MOUNT}",
            "rename": f"mv {MOUNT} /corral-moved",
        }
        outcomes = {
            name: (await sandbox.exec(["sh", "-c", command], user="0")).returncode
            for name, command in attacks.items()
        }
        graded = await sandbox.exec(["sh", "-c", "exit 3"])
        listed = await sandbox.exec(["sh", "-c", f"ls -l {MOUNT}; id"], user="0")
        running = await processes(sandbox)
    assert all(code != 0 for code in outcomes.values()), outcomes
    assert graded.returncode == 3 and graded.stdout == ""
    assert "corral-exec" in listed.stdout and "busybox" in listed.stdout, listed
    # PID 1 is the engine's init; its child corral's idle busybox; execs corral's helper.
    assert running[0].startswith(ENGINE_INIT), running
    assert corral_s(running), running
    assert any(c.startswith(HELPER) for c in running), "the exec channel runs corral's copy"


async def test_a_fork_runs_none_of_its_parent_s_code(
    engine: Any, docker_env: DockerEnvironment, tcp_targets: list[EgressTarget]
) -> None:
    async with docker_env.session(ExecutionPlan(image=TEST_IMAGE)) as parent:
        await tamper(parent)
        ref = await parent.save()
    fork = await docker_env.fork(ref, ExecutionPlan(image=TEST_IMAGE))
    try:
        assert isinstance(fork, DockerSession)
        await anyio.sleep(2)
        state = await fork.exec("cat /tmp/revived /tmp/hits 2>/dev/null; true")
        running = await processes(fork)
        graded = await fork.exec(["sh", "-c", "exit 3"])
    finally:
        await docker_env.close(fork)
        engine.images.remove(fork.image, force=True)
    assert state.stdout == "", "the fork started the parent's replaced sleep"
    assert corral_s(running), running
    assert graded.returncode == 3


async def test_read_text_and_download_refuse_a_huge_file_without_holding_it(
    docker_env: DockerEnvironment, tmp_path: Path
) -> None:
    async with docker_env.session(ExecutionPlan(image=TEST_IMAGE)) as sandbox:
        made = await sandbox.exec("truncate -s 700M /tmp/big && truncate -s 3M /tmp/small")
        assert made.returncode == 0, made
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with pytest.raises(TransferLimitExceeded, match=r"'/tmp/big'.*734003200 bytes.*limit"):
            await sandbox.read_text("/tmp/big")
        with pytest.raises(TransferLimitExceeded, match=r"'/tmp/small'.*limit of 1048576"):
            await sandbox.download("/tmp/small", tmp_path / "small", max_bytes=1 << 20)
        grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        await sandbox.download("/tmp/small", tmp_path / "small")
    assert grown_kib < 100 * 1024, f"the harness grew by {grown_kib} KiB"
    assert (tmp_path / "small").stat().st_size == 3 << 20
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small"]  # noqa: ASYNC240


@pytest.mark.parametrize(
    "lie",
    [
        # Every large number the real stat prints (a size) becomes 10.
        "#!/bin/sh\n/usr/bin/real-stat \"$@\" | sed -E 's/\\b[0-9]{7,}\\b/10/g'\n",
        # Security round 4 (issue 40, Also): a small size, and no read bit for anything
        # the adapter asks a mode of.
        "#!/bin/sh\ncase \"$*\" in *%a*) echo 'file 000';; *) echo 10;; esac\n",
    ],
    ids=["size", "mode"],
)
async def test_inspect_read_file_limit_is_not_the_sandbox_s_stat(
    docker_env: DockerEnvironment, lie: str
) -> None:
    async with docker_env.session(ExecutionPlan(image=TEST_IMAGE)) as sandbox:
        await sandbox.write_text("/tmp/note", "kept")
        assert await read_file(sandbox, "/tmp/note") == b"kept"
        await sandbox.write_text("/tmp/stat", lie)
        made = await sandbox.exec(
            "chmod 755 /tmp/stat && cp /usr/bin/stat /usr/bin/real-stat && "
            "cp /tmp/stat /usr/bin/stat && truncate -s 300M /tmp/big && stat -c %s /tmp/big",
            user="0",
        )
        assert made.stdout.strip() == "10", made
        assert made.returncode == 0, made
        with pytest.raises(OutputLimitExceededError):
            await read_file(sandbox, "/tmp/big")


async def test_a_dns_flood_does_not_starve_corral_s_switches(
    engine: Any, owner: str, upstream: str, tcp_targets: list[EgressTarget]
) -> None:
    env = make_env(owner, upstream_dns_servers=[upstream])
    allow = NetworkPolicy.allowlist("a.allowed.test")
    flood = (
        "import socket, struct\n"
        "q = struct.pack('>HHHHHH', 7, 0x0100, 1, 0, 0, 0)\n"
        "q += b''.join(bytes([len(p)]) + p.encode() for p in 'a.allowed.test'.split('.'))\n"
        "q += b'\\0\\0\\1\\0\\1'\n"
        "socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(64)]\n"
        "while True:\n"
        "    for s in socks:\n"
        "        s.sendto(q, ('127.0.0.54', 53))\n"
    )
    plan = ExecutionPlan(image=TEST_IMAGE, network=NetworkSchedule(baseline=allow))
    async with env.session(plan) as sandbox:
        for _ in range(2):
            await sandbox.exec(f'nohup python3 -c "{flood}" >/dev/null 2>&1 &', user="0")
        await anyio.sleep(2)
        for policy in [NetworkPolicy.no_network(), allow] * 3:
            await sandbox.set_network_policy(policy)  # raises if corral could not fork
        assert sandbox.policy == allow
        stopped = await sandbox.exec(["pkill", "-f", "127.0.0.54"], user="0")
        assert stopped.returncode == 0, stopped
        reached = await sandbox.exec(["nc", "-z", "-w", "3", "a.allowed.test", str(TCP_PORT)])
    assert reached.returncode == 0, reached
    assert leftovers(engine, owner) == []


async def test_every_program_corral_runs_in_the_sandbox_is_corral_s(
    engine: Any, owner: str, docker_env: DockerEnvironment, tmp_path: Path
) -> None:
    """A whole task (open with its probes, execs plain and timed out, file calls, switches,
    the end of the run, evaluation, save, close): the engine's own record of every exec in
    the sandbox container names only corral's read-only programs."""
    schedule = NetworkSchedule(
        baseline=NetworkPolicy.public(),
        run=NetworkPolicy.no_network(),
        evaluation=NetworkPolicy.public(),
    )
    plan = ExecutionPlan(image=TEST_IMAGE, network=schedule)
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "a.txt").write_text("a")
    since = int(time.time()) - 1
    async with TaskRun(docker_env, plan) as run:
        sandbox = run.session
        assert isinstance(sandbox, DockerSession)
        container = sandbox.sandbox
        async with run.running() as session:
            await session.exec(["true"])
            await session.exec("echo $HOME")
            timed = await session.exec(["sleep", "5"], timeout=1)
            assert timed.timed_out
            await session.upload_dir(tmp_path / "tree", "/srv/tree")
            await session.download_dir("/srv/tree", tmp_path / "back")
            await session.write_text("/srv/x", "x")
            assert await session.read_text("/srv/x") == "x"

        async def grade(session: EnvironmentSession) -> int | None:
            return (await session.exec(["sh", "-c", "exit 3"])).returncode

        assert await run.evaluate(grade) == 3
        ref = await sandbox.save()
        main = await anyio.to_thread.run_sync(engine.api.inspect_container, container)
    for image in engine.api.images(filters={"label": [f"{OWNER}={owner}", f"{SNAPSHOT}={ref.id}"]}):
        engine.images.remove(image["Id"], force=True)
    until = int(time.time()) + 1
    events = engine.api.events(
        since=since, until=until, decode=True, filters={"container": container}
    )
    execs = [e["Action"].split(": ", 1)[1] for e in events if e["Action"].startswith("exec_create")]
    assert execs, "the engine recorded the execs"
    assert [c for c in execs if c.split(" ", 1)[0] not in (HELPER, BUSYBOX)] == []
    assert main["Path"] == BUSYBOX and main["HostConfig"]["Init"] is True
