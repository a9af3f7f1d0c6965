"""The `local` provider learns what this host allows (network and PID namespaces,
cgroups) by starting `unshare` once per process: never on the event loop, where a slow
probe (up to its 10 s timeout) would stall every other task of the harness."""

from __future__ import annotations

import subprocess
import threading
from typing import Any

import pytest

from corral import ExecutionPlan, NetworkPolicy, NetworkSchedule
from corral.providers.local import LocalEnvironment
from corral.providers.local.cgroup import cgroup_available
from corral.providers.local.netns import netns_available
from corral.providers.local.pidns import pidns_available

pytestmark = pytest.mark.anyio


async def test_the_first_open_probes_the_host_in_a_worker_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for probe in (netns_available, cgroup_available, pidns_available):
        probe.cache_clear()
    loop = threading.current_thread()
    started: list[tuple[str, bool]] = []
    real: Any = subprocess.run

    def recording(argv: Any, *args: Any, **kwargs: Any) -> Any:
        started.append((" ".join(argv), threading.current_thread() is loop))
        return real(argv, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", recording)
    plan = ExecutionPlan(network=NetworkSchedule(baseline=NetworkPolicy.public()))
    async with LocalEnvironment().session(plan) as session:
        assert (await session.exec(["true"])).returncode == 0
    probes = [(argv, on_loop) for argv, on_loop in started if "unshare" in argv]
    assert probes, "no probe ran: the test would prove nothing"
    assert [argv for argv, on_loop in probes if on_loop] == []
