"""A Pod's containers share one IPC namespace (Kubernetes has no per-container one), and
by default one /dev/shm. The sandbox gets a /dev/shm of its own, and a SysV segment the
workload made goes with the workload at end_workload() (`kernel.shm_rmid_forced`)."""

from __future__ import annotations

import pytest

from corral import ExecutionPlan
from corral.providers.k8s.session import KubernetesSession
from tests.integration.k8s.conftest import TEST_IMAGE, make_env

pytestmark = pytest.mark.anyio

KEY = 0x636F7231
# Makes a SysV segment, stays attached to it and sleeps: a workload's process that holds it.
HOLD = rf"""
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
shmid = libc.shmget({KEY}, 4096, 0o1000 | 0o666)
assert shmid >= 0, ctypes.get_errno()
assert libc.shmat(shmid, None, 0) != ctypes.c_void_p(-1).value
print(shmid, flush=True)
time.sleep(3600)
"""
START = (
    'setsid python3 -c "$0" >/tmp/hold.out 2>&1 </dev/null & '
    "for _ in $(seq 150); do [ -s /tmp/hold.out ] && exit 0; sleep 0.2; done; exit 1"
)
PLAN = ExecutionPlan.model_validate(
    {
        "image": TEST_IMAGE,
        "network": {"baseline": "no-network"},
        "services": {"db": {"image": TEST_IMAGE, "command": ["sleep", "infinity"]}},
    }
)


async def _segments(session: KubernetesSession) -> set[int]:
    """The keys of the Pod's SysV segments, as the service sees them."""
    listed = await session.exec(["cat", "/proc/sysvipc/shm"], service="db")
    assert listed.ok, listed.stderr
    return {int(line.split()[0]) for line in listed.stdout.splitlines()[1:]}


async def test_the_sandbox_shares_no_dev_shm_and_its_segments_end_with_it(namespace: str) -> None:
    env = make_env(namespace)
    async with env.session(PLAN) as session:
        assert isinstance(session, KubernetesSession)
        wrote = await session.exec("echo sandbox-bytes > /dev/shm/x && echo svc > /tmp/y")
        assert wrote.ok, wrote.stderr
        seen = await session.exec(["cat", "/dev/shm/x"], service="db")
        assert not seen.ok and "sandbox-bytes" not in seen.stdout
        served = await session.exec("echo svc-bytes > /dev/shm/s", service="db")
        assert served.ok, served.stderr
        assert not (await session.exec(["cat", "/dev/shm/s"])).ok

        started = await session.exec(["sh", "-c", START, HOLD], timeout=60)
        assert started.ok, started.stderr
        assert KEY in await _segments(session), await session.read_text("/tmp/hold.out")
        await session.end_workload()
        assert KEY not in await _segments(session)
