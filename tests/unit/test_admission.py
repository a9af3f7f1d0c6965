"""Admission of opens: the adaptive gate on injected readings of the host, the shared rate
through `BaseEnvironment.open`, the bound, cancellation and the logs."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import anyio
import pytest
from pydantic import ValidationError

from corral import EnvironmentSession, ExecutionPlan, Timeouts
from corral.core import admission
from corral.core.admission import Admission
from corral.core.config import RuntimeEnvironmentConfig
from corral.core.hostload import HostProbe, HostReading
from corral.errors import AdmissionTimeout, StartupTimeout
from tests.unit.fakes import FakeEnvironment

pytestmark = pytest.mark.anyio

PLENTY = HostReading(free_memory_mb=8192, idle_cpu_percent=90, at=0.0)
LOW_MEMORY = HostReading(free_memory_mb=100, idle_cpu_percent=90, at=0.0)
BUSY = HostReading(free_memory_mb=8192, idle_cpu_percent=2, at=0.0)


class Readings:
    """Readings in order (the last repeats), noting whether each asked for a fresh one."""

    def __init__(self, *readings: HostReading) -> None:
        self.readings = list(readings)
        self.asked: list[bool] = []

    def __call__(self, *, fresh: bool) -> HostReading:
        self.asked.append(fresh)
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]


def _adaptive(**fields: object) -> RuntimeEnvironmentConfig:
    return RuntimeEnvironmentConfig.model_validate({"admission": "adaptive", **fields})


@pytest.fixture(autouse=True)
def _quick_polls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(admission, "POLL_S", 0.01)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))


# config


def test_the_defaults_change_nothing() -> None:
    config = RuntimeEnvironmentConfig()
    assert config.admission == "static" and config.max_opens_per_s is None
    assert not Admission("fake", config).gated


@pytest.mark.parametrize(
    "fields",
    [
        {"admission": "sometimes"},
        {"max_opens_per_s": 0},
        {"max_opens_per_s": -1},
        {"max_opens_per_s": float("inf")},
        {"admission_max_wait_s": 0},
        {"admission": "adaptive", "admission_min_idle_cpu_percent": 100},
        {"admission": "adaptive", "admission_min_free_memory_mb": -1},
        # thresholds that would do nothing
        {"admission_min_free_memory_mb": 2048},
        {"admission": "static", "admission_min_idle_cpu_percent": 20},
    ],
)
def test_bad_admission_settings_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        RuntimeEnvironmentConfig.model_validate(fields)


# the adaptive gate


async def test_static_reads_nothing() -> None:
    readings = Readings(LOW_MEMORY)
    await Admission("fake", RuntimeEnvironmentConfig(), read_host=readings).admit()
    assert readings.asked == []


async def test_a_host_with_room_admits_at_once_and_logs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    readings = Readings(PLENTY)
    with caplog.at_level(logging.DEBUG, logger="corral.admission"):
        await Admission("fake", _adaptive(), read_host=readings).admit()
    assert readings.asked == [False]
    assert caplog.records == []


@pytest.mark.parametrize(("short", "what"), [(LOW_MEMORY, "memory"), (BUSY, "cpu")])
async def test_an_open_waits_while_the_host_is_short_and_says_why(
    caplog: pytest.LogCaptureFixture, short: HostReading, what: str
) -> None:
    readings = Readings(short, short, short, PLENTY)
    with caplog.at_level(logging.INFO, logger="corral.admission"):
        await Admission("fake", _adaptive(), read_host=readings).admit()
    assert readings.asked == [False, True, True, True]
    waits, admitted = caplog.records
    assert waits.getMessage().startswith("open waits for host resources")
    fields = waits.__dict__["corral"]
    assert fields["short"] == what
    assert fields["min_free_memory_mb"] == 1024
    assert fields["min_idle_cpu_percent"] == 10.0
    assert admitted.getMessage().startswith("open admitted")
    assert admitted.__dict__["corral"]["host_wait_s"] > 0


async def test_the_wait_is_bounded_and_the_error_names_what_was_short(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = Admission("fake", _adaptive(admission_max_wait_s=0.2), read_host=Readings(BUSY))
    started = time.monotonic()
    with (
        caplog.at_level(logging.WARNING, logger="corral.admission"),
        pytest.raises(AdmissionTimeout, match=r"admission_max_wait_s=0\.2 .*free cpu .*2% idle"),
    ):
        await gate.admit()
    assert time.monotonic() - started < 2
    assert [r.getMessage().split(" provider")[0] for r in caplog.records] == ["open not admitted"]
    assert issubclass(AdmissionTimeout, StartupTimeout)


async def test_after_a_wait_opens_go_one_per_fresh_reading() -> None:
    recovered = anyio.Event()
    seen: list[tuple[bool, HostReading]] = []

    def read(*, fresh: bool) -> HostReading:
        seen.append((fresh, PLENTY if recovered.is_set() else BUSY))
        return seen[-1][1]

    config = _adaptive()
    admitted: list[int] = []

    async def one(n: int) -> None:
        await Admission("fake", config, read_host=read).admit()
        admitted.append(n)

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, 0)
        await anyio.sleep(0.05)  # the first is waiting: the others queue behind it
        tg.start_soon(one, 1)
        tg.start_soon(one, 2)
        await anyio.sleep(0.05)
        recovered.set()
    assert admitted == [0, 1, 2]
    assert [fresh for fresh, _ in seen].count(False) == 1, "later arrivals did not jump in"
    # each went on a reading of its own, taken after the one before it went
    assert [fresh for fresh, reading in seen if reading is PLENTY] == [True, True, True]


async def test_cancelling_a_waiting_open_is_not_swallowed() -> None:
    gate = Admission("fake", _adaptive(), read_host=Readings(BUSY))
    reached = False
    with anyio.move_on_after(0.1) as scope:
        await gate.admit()
        reached = True
    assert scope.cancelled_caught and not reached
    # the process's queue is free again
    await Admission("fake", _adaptive(), read_host=Readings(PLENTY)).admit()


def test_the_real_probe_reads_this_host() -> None:
    reading = HostProbe().read()
    assert reading.free_memory_mb > 0
    assert 0 <= reading.idle_cpu_percent <= 100


# the rate, through open()


def _env(**fields: object) -> FakeEnvironment:
    env = FakeEnvironment(steps=1)
    env.config = RuntimeEnvironmentConfig.model_validate(fields)
    return env


async def test_opens_are_spaced_by_the_rate_and_the_wait_is_not_startup_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = _env(max_opens_per_s=10)
    # 5 opens at 10/s: the last waits 0.4 s for admission, beyond its startup_s
    plan = ExecutionPlan(timeouts=Timeouts(startup_s=0.2))
    sessions: list[EnvironmentSession] = []
    began: list[float] = []

    async def one() -> None:
        sessions.append(await env.open(plan))
        began.append(time.monotonic())

    with caplog.at_level(logging.INFO, logger="corral.admission"):
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(one)
    assert len(sessions) == 5
    assert max(began) - min(began) >= 0.3
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("open waits for the shared open rate") for m in messages)
    assert sum(m.startswith("open admitted") for m in messages) == 4
    for session in sessions:
        await env.close(session)
    assert env.live == set()


async def test_an_open_not_admitted_in_time_fails_and_leaves_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = _env(max_opens_per_s=0.1, admission_max_wait_s=0.2)
    first = await env.open(ExecutionPlan())
    with (
        caplog.at_level(logging.WARNING, logger="corral"),
        pytest.raises(AdmissionTimeout, match=r"max_opens_per_s=0\.1"),
    ):
        await env.open(ExecutionPlan())
    assert any(r.getMessage().startswith("open failed") for r in caplog.records)
    await env.close(first)
    assert env.live == set()


async def test_a_corrupt_state_file_does_not_break_opens(tmp_path: Path) -> None:
    env = _env(max_opens_per_s=20)
    first = await env.open(ExecutionPlan())
    (state,) = (tmp_path / "corral").iterdir()
    state.write_bytes(b"garbage")
    second = await env.open(ExecutionPlan())  # rebuilt: waits 1/rate, then opens
    for session in (first, second):
        await env.close(session)
