"""The shared bucket of `max_opens_per_s`: processes really contending on one state file
never take two tokens closer than 1/rate, and a corrupt or hostile state file neither
breaks a take nor widens the rate."""

from __future__ import annotations

import fcntl
import itertools
import json
import multiprocessing
import os
import tempfile
import threading
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import pytest

from corral.core import openrate
from corral.core.openrate import OpenRateBucket, OpenRateUnavailable, Stopped, state_dir

RATE = 40.0


def _taker(path: str, rate: float, count: int, go: Event, out: Queue[Any]) -> None:
    bucket = OpenRateBucket(Path(path), rate)
    taken: list[float] = []
    go.wait()
    while len(taken) < count:
        take = bucket.try_take()
        if take.taken:
            taken.append(take.at)
        else:
            time.sleep(take.wait_s)
    out.put(taken)


def test_processes_contending_on_one_file_take_at_most_the_rate(tmp_path: Path) -> None:
    mp = multiprocessing.get_context("spawn")
    out: Queue[Any] = mp.Queue()
    go = mp.Event()
    path, each = tmp_path / "opens.json", 15
    children = [mp.Process(target=_taker, args=(str(path), RATE, each, go, out)) for _ in range(4)]
    for child in children:
        child.start()
    try:
        time.sleep(0.5)  # let them start, so that they contend from the first take
        go.set()
        per_process = [out.get(timeout=60) for _ in children]
    finally:
        for child in children:
            child.join(timeout=10)
    assert all(len(taken) == each for taken in per_process)
    times = sorted(at for taken in per_process for at in taken)
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # A capacity of one: any two takes, of any processes, at least 1/rate apart.
    assert min(gaps) >= 1 / RATE - 1e-6
    # ... and the rate is reached, not starved (2 shared cores: generous).
    assert times[-1] - times[0] < 2 * (len(times) - 1) / RATE + 1


def test_a_new_file_gives_one_token_then_the_rate(tmp_path: Path) -> None:
    bucket = OpenRateBucket(tmp_path / "opens.json", 10.0)
    first, second = bucket.try_take(), bucket.try_take()
    assert first.taken and first.rebuilt is None
    assert not second.taken
    assert 0.09 < second.wait_s <= 0.1
    assert (bucket.path.stat().st_mode & 0o777) == 0o600


def _valid(tokens: float, at: float, boot: str | None = None) -> bytes:
    boot = openrate._boot_id() if boot is None else boot  # pyright: ignore[reportPrivateUsage]
    return json.dumps({"tokens": tokens, "at": at, "boot": boot}).encode()


CORRUPT: dict[str, Any] = {
    "garbage": lambda: b"\x00\xffnot json at all",
    "empty object": lambda: b"{}",
    "a list": lambda: b"[1.0, 2.0]",
    "integer tokens": lambda: b'{"tokens": 1, "at": 1.0, "boot": "x"}',
    "tokens above one": lambda: _valid(1e9, time.monotonic() - 100),
    "negative tokens": lambda: _valid(-1e9, time.monotonic()),
    "NaN": lambda: _valid(float("nan"), time.monotonic()),
    "infinite time": lambda: _valid(1.0, float("-inf")),
    "a time in the future": lambda: _valid(1.0, time.monotonic() + 3600),
    "another boot": lambda: _valid(1.0, 0.0, boot="not-this-boot"),
    "too large": lambda: b" " * 10_000 + _valid(1.0, 0.0),
}


@pytest.mark.parametrize("name", sorted(CORRUPT))
def test_a_corrupt_state_is_rebuilt_with_no_token(tmp_path: Path, name: str) -> None:
    path = tmp_path / "opens.json"
    path.write_bytes(CORRUPT[name]())
    path.chmod(0o600)
    bucket = OpenRateBucket(path, 10.0)
    take = bucket.try_take()
    assert not take.taken, "a corrupt state must not grant a token"
    assert take.rebuilt is not None
    assert take.wait_s == pytest.approx(0.1)
    # rebuilt: the next reader finds a state it can use
    again = bucket.try_take()
    assert again.rebuilt is None and not again.taken


def test_a_symlink_is_replaced_never_followed(tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.write_text("keep me")
    path = tmp_path / "opens.json"
    path.symlink_to(precious)
    take = OpenRateBucket(path, 10.0).try_take()
    assert not take.taken and take.rebuilt == "a symlink"
    assert precious.read_text() == "keep me"
    assert path.is_file() and not path.is_symlink()


def test_a_dangling_symlink_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "opens.json"
    path.symlink_to(tmp_path / "elsewhere")
    take = OpenRateBucket(path, 10.0).try_take()
    assert not take.taken and take.rebuilt == "a symlink"
    assert not (tmp_path / "elsewhere").exists()


def test_a_fifo_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "opens.json"
    os.mkfifo(path, 0o600)
    take = OpenRateBucket(path, 10.0).try_take()
    assert not take.taken and take.rebuilt == "not a regular file"


def test_a_file_writable_by_others_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "opens.json"
    path.write_bytes(_valid(1.0, time.monotonic() - 100))
    path.chmod(0o666)
    take = OpenRateBucket(path, 10.0).try_take()
    assert not take.taken and take.rebuilt == "writable by others"
    assert (path.stat().st_mode & 0o777) == 0o600


@pytest.mark.skipif(os.getuid() != 0, reason="making another user's file needs root")
def test_another_users_file_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "opens.json"
    path.write_bytes(_valid(1.0, time.monotonic() - 100))
    path.chmod(0o600)
    os.chown(path, 65534, 65534)
    take = OpenRateBucket(path, 10.0).try_take()
    assert not take.taken and take.rebuilt == "owned by uid 65534"
    assert path.stat().st_uid == os.getuid()


def test_a_directory_in_the_way_fails_closed(tmp_path: Path) -> None:
    path = tmp_path / "opens.json"
    (path / "inside").mkdir(parents=True)
    with pytest.raises(OpenRateUnavailable, match="not a regular file"):
        OpenRateBucket(path, 10.0).try_take()


def test_a_held_lock_waits_and_stop_ends_the_wait(tmp_path: Path) -> None:
    bucket = OpenRateBucket(tmp_path / "opens.json", 10.0)
    bucket.try_take()
    fd = os.open(bucket.path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a process that holds it and never lets go
        stop = threading.Event()
        threading.Timer(0.1, stop.set).start()
        started = time.monotonic()
        with pytest.raises(Stopped):
            bucket.try_take(stop)
        assert 0.09 < time.monotonic() - started < 2
    finally:
        os.close(fd)


def test_the_state_dir_skips_what_is_not_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (runtime / "corral").symlink_to(elsewhere)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    (temp / f"corral-{os.getuid()}").mkdir(mode=0o777)
    (temp / f"corral-{os.getuid()}").chmod(0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert state_dir() == tmp_path / "cache" / "corral" / "run"
    (runtime / "corral").unlink()
    assert state_dir() == runtime / "corral"
    assert (runtime / "corral").stat().st_mode & 0o777 == 0o700
