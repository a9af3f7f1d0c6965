"""`max_opens_per_s`: one rate of opens shared by every process of this user on this host.

A token bucket of capacity one whose whole state, the tokens left and when they were
counted, is one small file that is read and written only under `fcntl.flock`; no daemon.
With a capacity of one, two opens of any processes are admitted at least `1/rate` apart,
so no window of one second ever holds more than `rate` of them (rounded up). Each process
refills at its own `max_opens_per_s`, so processes that share a provider should agree on it.

The file lives in a directory only this user can write (`$XDG_RUNTIME_DIR/corral`, else
`<tmp>/corral-<uid>`, else `~/.cache/corral/run`), one per provider and host. Anything
else this user runs can still write it (a `local` sandbox can), so what is read is never
trusted to widen the rate: tokens are capped at one, and a state that cannot be read as
one this code wrote (garbage, a time in the future, another boot's clock) is rebuilt with
no token, so the next open waits `1/rate`. A symlink, a file that is not regular or is
another user's, is unlinked (never followed) and made afresh. All of it blocks: call it
from a worker thread (`stop` ends a wait for the lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import math
import os
import re
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from corral.core.snapshot_store import cache_dir
from corral.errors import ConfigError

#: How often a process that finds the file locked tries again.
LOCK_POLL_S = 0.002
#: Replacements of a hostile file before giving up (someone keeps putting it back).
MAX_REBUILDS = 8
MAX_STATE_BYTES = 4096
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class OpenRateUnavailable(ConfigError):
    """The shared state of `max_opens_per_s` cannot be kept safely; no open is admitted."""


class Stopped(Exception):
    """`stop` was set while waiting for the lock."""


@dataclass(frozen=True)
class Take:
    """One attempt: `taken`, else seconds until a token will be there; `rebuilt` names why
    the state read was not used, if it was not."""

    taken: bool
    wait_s: float
    #: `time.monotonic()` (CLOCK_MONOTONIC, the same in every process) under the lock
    at: float
    rebuilt: str | None = None


@functools.cache
def _boot_id() -> str:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""


def _private_dir(path: Path) -> bool:
    """Made if missing; usable only as a real directory of this user that no one else can
    write."""
    with contextlib.suppress(OSError):
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        info = path.lstat()
    except OSError:
        return False
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == os.getuid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def state_dir() -> Path:
    """The first private directory among the runtime dir, the temp dir and the cache."""
    candidates: list[Path] = []
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and Path(runtime).is_absolute():
        candidates.append(Path(runtime) / "corral")
    candidates.append(Path(tempfile.gettempdir()) / f"corral-{os.getuid()}")
    candidates.append(cache_dir() / "run")
    for path in candidates:
        if _private_dir(path):
            return path
    raise OpenRateUnavailable(
        "max_opens_per_s keeps its state in a directory only this user can write, and none "
        f"of {', '.join(map(str, candidates))} is one (owned by another user, a symlink, "
        "writable by others, or not creatable); fix one of them or unset max_opens_per_s"
    )


def state_path(provider: str, directory: Path | None = None) -> Path:
    host = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())[:64] or "host"
    return (directory or state_dir()) / f"opens-{provider}-{host}.json"


def _parse(data: bytes) -> tuple[float, float, str] | None:
    """(tokens, at, boot) of a state as `_write` makes it, else None."""
    if len(data) > MAX_STATE_BYTES:
        return None
    try:
        state: object = json.loads(data)
    except ValueError:  # UnicodeDecodeError included
        return None
    if not isinstance(state, dict):
        return None
    fields = cast("dict[str, object]", state)
    tokens, at, boot = fields.get("tokens"), fields.get("at"), fields.get("boot")
    if not (isinstance(tokens, float) and isinstance(at, float) and isinstance(boot, str)):
        return None
    return tokens, at, boot


_CREATED = "created"


def _what(info: os.stat_result) -> str | None:
    """What makes `info` unfit to hold the state; None if it is fit."""
    if stat.S_ISLNK(info.st_mode):
        return "a symlink"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if info.st_uid != os.getuid():
        return f"owned by uid {info.st_uid}"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return "writable by others"
    if info.st_nlink != 1:
        return "hard-linked"
    return None


class OpenRateBucket:
    """The shared bucket at `path`, refilled at `rate_per_s` by this process."""

    def __init__(self, path: Path, rate_per_s: float) -> None:
        if not (math.isfinite(rate_per_s) and rate_per_s > 0):
            raise ConfigError(f"max_opens_per_s={rate_per_s} is not a positive number")
        self.path = path
        self.rate_per_s = rate_per_s
        self._boot = _boot_id()

    def try_take(self, stop: threading.Event | None = None) -> Take:
        """Take the token if it is there; else say how long until it will be."""
        with self._locked(stop) as (fd, made):
            now = time.monotonic()
            tokens, rebuilt = self._tokens(fd, now, made)
            if tokens >= 1.0 - 1e-9:
                self._write(fd, tokens - 1.0, now)
                return Take(True, 0.0, now, rebuilt)
            self._write(fd, tokens, now)
            return Take(False, (1.0 - tokens) / self.rate_per_s, now, rebuilt)

    def _tokens(self, fd: int, now: float, made: str | None) -> tuple[float, str | None]:
        data = os.pread(fd, MAX_STATE_BYTES + 1, 0)
        if not data:
            # Made by this call where there was nothing: a full bucket. Made in place of
            # something hostile: none. Made by another process still on its way to the
            # lock: none, until that process has taken its own.
            return (1.0 if made == _CREATED else 0.0), (None if made == _CREATED else made)
        state = _parse(data)
        if state is None:
            return 0.0, "unreadable"
        tokens, at, boot = state
        if not (math.isfinite(tokens) and math.isfinite(at)) or not 0.0 <= tokens <= 1.0:
            return 0.0, "out of range"
        if boot != self._boot:
            return 0.0, "from another boot"
        if at > now:
            return 0.0, "timestamped in the future"
        return min(1.0, tokens + (now - at) * self.rate_per_s), None

    def _write(self, fd: int, tokens: float, now: float) -> None:
        data = json.dumps({"tokens": tokens, "at": now, "boot": self._boot}).encode()
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))

    @contextlib.contextmanager
    def _locked(self, stop: threading.Event | None) -> Generator[tuple[int, str | None]]:
        """The state file, open and exclusively locked, and how this call made it (`_open`);
        the file locked is the one at the path, not one replaced while we waited."""
        for _ in range(MAX_REBUILDS):
            fd, made = self._open()
            try:
                self._lock(fd, stop)
                held = os.fstat(fd)
                try:
                    now_there = self.path.lstat()
                except FileNotFoundError:
                    continue
                if (held.st_dev, held.st_ino) == (now_there.st_dev, now_there.st_ino):
                    yield fd, made
                    return
            finally:
                os.close(fd)  # also releases the lock
        raise OpenRateUnavailable(
            f"the open rate's state file {self.path} kept being replaced; no open is admitted "
            "while something else rewrites it"
        )

    def _open(self) -> tuple[int, str | None]:
        """A private regular file of this user at the path, and how it came to be: None
        (it was there), `_CREATED` (nothing was), or what was removed to make it (a
        symlink itself, never what it points to; another user's file; a FIFO ...)."""
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        removed: str | None = None
        for _ in range(MAX_REBUILDS):
            try:
                fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:
                pass
            else:
                return fd, removed or _CREATED
            try:
                fd = os.open(self.path, flags)
            except FileNotFoundError:
                continue
            except OSError:
                # a symlink (ELOOP), a socket (ENXIO), a directory, a file we may not open
                try:
                    seen = self.path.lstat()
                except FileNotFoundError:
                    continue
                removed = _what(seen) or "a file that cannot be opened"
                self._remove(seen, removed)
                continue
            info = os.fstat(fd)
            wrong = _what(info)
            if wrong is None:
                return fd, removed
            os.close(fd)
            removed = wrong
            self._remove(info, wrong)
        raise OpenRateUnavailable(
            f"the open rate's state file {self.path} could not be made a private regular "
            "file; no open is admitted"
        )

    def _remove(self, seen: os.stat_result, what: str) -> None:
        """Unlink what is at the path if it is still `seen` (not what another process has
        just put right)."""
        try:
            now_there = self.path.lstat()
            if (now_there.st_dev, now_there.st_ino) == (seen.st_dev, seen.st_ino):
                self.path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise OpenRateUnavailable(
                f"the open rate's state file {self.path} is {what} and cannot be removed "
                f"({exc}); no open is admitted until it is removed"
            ) from exc

    def _lock(self, fd: int, stop: threading.Event | None) -> None:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if stop is not None and stop.is_set():
                    raise Stopped from None
                time.sleep(LOCK_POLL_S)
