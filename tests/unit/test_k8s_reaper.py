"""The reaper's verdict is not its word alone: the Pod's containers, as the API server
lists them after it, must be as they were (security round 4, issue 40, 8: under gVisor a
reaper's `kill(-1)` ended the probe and the services, and reported clean)."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from corral.errors import WorkloadNotStopped
from corral.providers.k8s.reaper import _REAP, Reaper  # pyright: ignore[reportPrivateUsage]

pytestmark = pytest.mark.anyio

RUNNING = SimpleNamespace(running=SimpleNamespace(started_at="t0"))
KILLED = SimpleNamespace(running=None, terminated=SimpleNamespace(exit_code=137))


def _pod(**containers: tuple[str, int, Any]) -> Any:
    statuses = [
        SimpleNamespace(name=name, container_id=cid, restart_count=restarts, state=state)
        for name, (cid, restarts, state) in containers.items()
    ]
    return SimpleNamespace(status=SimpleNamespace(container_statuses=statuses, phase="Running"))


WHOLE = {
    "sandbox": ("containerd://a", 0, RUNNING),
    "corral-probe": ("containerd://b", 0, RUNNING),
    "svc-db": ("containerd://c", 0, RUNNING),
}


def _reaper(monkeypatch: pytest.MonkeyPatch, *pods: Any) -> Reaper:
    reaper = Reaper(SimpleNamespace(pod="pod-1"), "busybox", "IfNotPresent", 1.0)  # type: ignore[arg-type]
    read: Iterator[Any] = iter(pods)

    async def pod() -> Any:
        return next(read)

    async def run(script: str, *args: str) -> tuple[int, str]:
        assert script == _REAP
        return 0, "clean"

    monkeypatch.setattr(reaper, "_pod", pod)
    monkeypatch.setattr(reaper, "run", run)
    return reaper


async def test_a_clean_verdict_with_the_containers_as_they_were_stands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await _reaper(monkeypatch, _pod(**WHOLE), _pod(**WHOLE)).end_workload()


@pytest.mark.parametrize(
    "after",
    [
        {
            **WHOLE,
            "corral-probe": ("containerd://b", 0, KILLED),
            "svc-db": ("containerd://c", 1, RUNNING),
        },
        {**WHOLE, "sandbox": ("containerd://d", 0, RUNNING)},
        {k: v for k, v in WHOLE.items() if k != "svc-db"},
    ],
    ids=["probe-killed-service-restarted", "sandbox-replaced", "service-gone"],
)
async def test_a_clean_verdict_that_reached_another_container_fails(
    monkeypatch: pytest.MonkeyPatch, after: dict[str, tuple[str, int, Any]]
) -> None:
    changed = sorted(name for name in WHOLE if after.get(name) != WHOLE[name])
    reaper = _reaper(monkeypatch, _pod(**WHOLE), _pod(**after))
    with pytest.raises(WorkloadNotStopped, match="reported clean.*" + ", ".join(changed)):
        await reaper.end_workload()
