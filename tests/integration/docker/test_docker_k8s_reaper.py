"""The k8s reaper's script where the runtime puts it in the root of the Pod's PID
namespaces rather than in the sandbox container's (gVisor's runsc: every container of a
Pod reports the sandbox process's pid, so `targetContainerName`'s `/proc/<pid>/ns/pid` is
the sandbox's own and runsc's `fixPidns` drops the namespace; there `kill(-1)` ended the
probe and the services too, issue 40, 8).

Re-enacted on the real engine, no cluster needed, under runc (Linux's namespaces) and
runsc (gVisor's own: its /proc, its namespace links, its `kill`): one container stands
for the Pod's root namespace (its PID 1 is none of the sandbox's), a
"sandbox" runs in a child PID and mount namespace with corral's busybox at /.corral and an
idle PID 1 like the gate's, a "service" in another child namespace. The reaper's script,
run from the root, must end the sandbox's processes but its PID 1 and touch nothing else.
"""

from __future__ import annotations

import io
import tarfile
from typing import Any

import pytest

from corral.core.labels import OWNER
from corral.providers.k8s.reaper import _REAP  # pyright: ignore[reportPrivateUsage]
from tests.integration.docker.conftest import HOLDER_IMAGE, TEST_IMAGE

# The gate's shape: PID 1 of its namespace, idle on a FIFO it holds, forking nothing.
SANDBOX = (
    "mkdir -p /.corral && mount -t tmpfs programs /.corral && cp /busybox /.corral/busybox "
    "&& exec setpriv --bounding-set -sys_ptrace /.corral/busybox sh -c "
    "'mkfifo /tmp/idle && exec 3<>/tmp/idle && while :; do read -r _ <&3; done'"
)
WORKLOAD = (
    "/.corral/busybox sleep 2000 & /.corral/busybox setsid /.corral/busybox sh -c "
    "'while :; do /.corral/busybox sleep 3000; done' & exec /.corral/busybox sleep 2001"
)
SETUP = """
setsid unshare --pid --fork --mount --propagation private sh -c "$SANDBOX" >/dev/null 2>&1 &
setsid unshare --pid --fork /bin/sleep 1001 >/dev/null 2>&1 &
sleep 1
init=$(pgrep -f "^/.corral/busybox sh -c mkfifo")
nsenter -t "$init" -p -m /.corral/busybox sh -c "$WORKLOAD" >/dev/null 2>&1 &
sleep 1
echo "$init"
"""


def _sh(pod: Any, script: str, **env: str) -> str:
    code, out = pod.exec_run(["sh", "-c", script], environment=env)
    assert code == 0, out
    return out.decode()


def _processes(pod: Any) -> dict[int, str]:
    """The live processes the container sees (a zombie is dead), by pid."""
    listed = _sh(pod, "ps -eo pid=,stat=,args=")
    rows = (line.split(None, 2) for line in listed.splitlines())
    return {int(pid): args for pid, stat, args in rows if not stat.startswith("Z")}


@pytest.fixture
def pod(engine: Any, owner: str, runtime: str) -> Any:
    box = engine.containers.run(
        TEST_IMAGE,
        runtime=runtime,
        entrypoint=["sleep", "infinity"],
        detach=True,
        labels={OWNER: owner},
        cap_add=["SYS_ADMIN", "SYS_PTRACE"],
        security_opt=["seccomp=unconfined", "apparmor=unconfined"],
    )
    holder = engine.containers.create(HOLDER_IMAGE, labels={OWNER: owner})
    programs, _ = engine.api.get_archive(holder.id, "/bin/busybox")
    box.put_archive("/", b"".join(programs))
    holder.remove()
    box.put_archive("/", _file("reap.sh", _REAP.encode()))
    yield box
    box.remove(force=True)


def _file(name: str, data: bytes) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        member = tarfile.TarInfo(name)
        member.size = len(data)
        archive.addfile(member, io.BytesIO(data))
    return out.getvalue()


def test_a_reaper_in_the_root_namespace_ends_only_the_sandbox_s_processes(pod: Any) -> None:
    init = int(_sh(pod, SETUP, SANDBOX=SANDBOX, WORKLOAD=WORKLOAD))
    before = _processes(pod)
    workload = {p for p, args in before.items() if args.startswith("/.corral/") and p != init}
    service = next(pid for pid, args in before.items() if args == "/bin/sleep 1001")
    assert len(workload) == 4, before
    verdict = _sh(pod, "/busybox sh /reap.sh 30; echo $?; cat /dev/termination-log")
    after = _processes(pod)
    assert verdict.split() == ["0", "clean"], (verdict, before, after)
    assert workload.isdisjoint(after), after
    assert {init, service, 1} <= set(after) and after[service] == before[service]
    assert {pid: before[pid] for pid in set(before) - workload if pid in after} == {
        pid: args for pid, args in after.items() if pid in before
    }
