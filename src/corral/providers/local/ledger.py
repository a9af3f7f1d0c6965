"""A record of each open `local` session, so `corral gc` finds what a killed harness left.

Closing a session removes its workspace, ends its processes and drops its record. A harness
killed outright (SIGKILL, OOM, a lost machine) does none of that: its PID namespace dies
with it, but a cgroup and the processes in it, and the workspace, stay. The record names
them by exact path, with the harness that opened them (pid and kernel start time, so a
pid the kernel has reused is not taken for it); `gc` removes what the records of dead
harnesses of this owner name, and only what passes the same checks corral made when it
created it. The records live in a directory only the harness's user can read.
"""

from __future__ import annotations

import contextlib
import os
import re
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from corral.core.labels import is_session_id

_RECORD = re.compile(r"^corral-session-([0-9a-z]{12})\.json$")


class SessionRecord(BaseModel):
    """One open session: what it holds on the host, and who opened it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    owner: str
    workspace: Path
    cgroup: Path | None
    harness_pid: int
    #: the harness's start time in clock ticks since boot (`/proc/<pid>/stat`, field 22)
    harness_started: int
    created_at: datetime

    def harness_alive(self) -> bool:
        return _started(self.harness_pid) == self.harness_started

    # A record is a file the host user (and so a `local` workload) could have written:
    # what it names is removed only if it looks as corral made it for this session.

    def removable_workspace(self) -> Path | None:
        path = self.workspace
        if not (path.is_absolute() and path.name.startswith(f"corral-{self.id}-")):
            return None
        return path if path.is_dir() and not path.is_symlink() else None

    def removable_cgroup(self) -> Path | None:
        path = self.cgroup
        if path is None or not path.is_absolute() or path.name != f"corral-{self.id}":
            return None
        return path if (path / "cgroup.kill").is_file() and not path.is_symlink() else None


class SessionLedger:
    """This owner's session records under `root`."""

    def __init__(self, root: Path, *, owner: str) -> None:
        self.root = root
        self.owner = owner

    def write(self, session_id: str, workspace: Path, cgroup: Path | None) -> None:
        """Record the session before it is handed out; atomically, so a reader never sees
        half a record."""
        pid = os.getpid()
        started = _started(pid)
        assert started is not None  # this process is alive, so its stat is there
        record = SessionRecord(
            id=session_id,
            owner=self.owner,
            workspace=workspace,
            cgroup=cgroup,
            harness_pid=pid,
            harness_started=started,
            created_at=datetime.now(UTC),
        )
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial = self.root / f".corral-session-{session_id}.json.partial"
        partial.write_text(record.model_dump_json(), encoding="utf-8")
        partial.replace(self._path(session_id))

    def drop(self, session_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(session_id).unlink()

    def abandoned(self) -> list[SessionRecord]:
        """The records of this owner whose harness is gone."""
        if not self.root.is_dir():
            return []
        found: list[SessionRecord] = []
        for entry in sorted(self.root.iterdir()):
            named = _RECORD.match(entry.name)
            if named is None or entry.is_symlink():
                continue
            try:
                record = SessionRecord.model_validate_json(entry.read_bytes())
            except (OSError, ValidationError):
                continue
            if record.id != named.group(1) or not is_session_id(record.id):
                continue
            if record.owner == self.owner and not record.harness_alive():
                found.append(record)
        return found

    def _path(self, session_id: str) -> Path:
        return self.root / f"corral-session-{session_id}.json"


def _started(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name, which may hold spaces and parentheses; 22 is 20th.
    return int(stat[stat.rindex(")") + 2 :].split()[19])
