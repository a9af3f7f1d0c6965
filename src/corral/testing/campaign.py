"""The cancellation campaign: each public operation cancelled at its 1st, 2nd, ... Nth
checkpoint (see `checkpoints`), until it completes without meeting the cancellation.

After every attempt, and once whatever the attempt opened is closed again:
- the operation raised the cancellation, or returned because the rest of it was shielded;
- the provider objects carrying the run's owner label are exactly those that were there
  before the attempt (the campaign's own live session, or none);
- no thread started during the attempt is still at work (idle pool workers may stay);
- no corral temporary entry appeared in tempfile's directory or beside a download's
  destination, and a download's destination is either absent or the whole tree;
- a cancelled `exec` stopped its command within `PROMPT_S`, and no process it started is
  alive on the host;
- after a cancelled `set_network_policy`, the policy the session reports is the old one or
  no network (the new one only where the switch ran to its end), and connecting to two
  host listeners shows exactly that policy (never the union, never a mix), unless the
  switch closed the session.

Run it with tempfile's directory private to the campaign (the tests do), so that other
users of corral on the host cannot count as its leaks.
"""

from __future__ import annotations

import abc
import itertools
import secrets
import tempfile
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio

from corral.core.environment import BaseEnvironment
from corral.core.plan import ExecutionPlan
from corral.core.session import EnvironmentSession
from corral.network.policy import NetworkMode, NetworkPolicy
from corral.testing.checkpoints import DEFECTS, Attempt, Outcome, cancel_at
from corral.testing.leftovers import busy_threads, settled, tagged_processes, temp_entries
from corral.testing.plugin import ConnectCommand, EgressTarget

OPERATIONS = ("open", "close", "set_network_policy", "exec", "upload_dir", "download_dir")
#: Causes that are leaks (the rest of `Problem.cause` values are failures).
LEAKS = ("provider objects", "threads", "temp files", "processes")
#: A path that never completes is a defect of its own, not a reason to run forever.
HARD_LIMIT_N = 2000
_TAG = "CORRAL_CAMPAIGN"
T = TypeVar("T")
#: The exec under test outlives `PROMPT_S`, so that one that only returns when its command
#: ends is told apart from one that stops it.
_EXEC = ["sh", "-c", "sleep 3 & echo out; echo err >&2; wait"]
PROMPT_S = 2.0


@dataclass(frozen=True)
class Subject:
    """What the campaign runs against: a provider and the means to see what it left."""

    provider: str
    env: BaseEnvironment
    plan: ExecutionPlan
    """Its baseline must be `switch[0]`."""
    owned: Callable[[], frozenset[str]]
    """Names of the provider objects carrying the run's owner label (Docker containers and
    networks, Pods, NetworkPolicies), a blocking call; a provider that makes none returns
    an empty set. Also called when each cancellation is requested (`Attempt.present`)."""
    targets: tuple[EgressTarget, EgressTarget]
    """Two host listeners the sandbox reaches under `public`."""
    switch: tuple[NetworkPolicy, NetworkPolicy]
    """`set_network_policy` switches from the first to the second."""
    connect: ConnectCommand
    scratch: Path
    """An empty host directory of the campaign's own."""
    max_n: int | None = None
    """Stop at this N even if the operation did not complete (a bounded run)."""


@dataclass(frozen=True)
class Problem:
    n: int
    cause: str
    detail: str


@dataclass
class Report:
    provider: str
    operation: str
    attempts: list[Attempt] = field(default_factory=list[Attempt])
    problems: list[Problem] = field(default_factory=list[Problem])
    completed: bool = False

    @property
    def faults(self) -> int:
        return sum(a.outcome is not Outcome.COMPLETED for a in self.attempts)

    @property
    def leaks(self) -> list[Problem]:
        return [p for p in self.problems if p.cause in LEAKS]

    @property
    def failures(self) -> list[Problem]:
        return [p for p in self.problems if p.cause not in LEAKS]


async def run_campaign(subject: Subject, operation: str) -> Report:
    """Cancel `operation` at N = 1, 2, ... until it completes (or `subject.max_n`)."""
    report = Report(subject.provider, operation)
    case = _CASES[operation](subject)
    await case.setup()
    try:
        for n in itertools.count(1):
            if (subject.max_n is not None and n > subject.max_n) or n > HARD_LIMIT_N:
                break
            attempt = await _checked(subject, case, n, report)
            report.attempts.append(attempt)
            if attempt.outcome is Outcome.COMPLETED:
                report.completed = True
                break
    finally:
        with anyio.CancelScope(shield=True):
            await case.teardown()
    left = await anyio.to_thread.run_sync(subject.owned)
    if left:
        report.problems.append(Problem(0, "provider objects", f"after the campaign: {left}"))
    if not report.completed and subject.max_n is None:
        last = len(report.attempts)
        report.problems.append(Problem(last, "never completed", f"still cancelled at N={last}"))
    return report


async def _checked(subject: Subject, case: _Case, n: int, report: Report) -> Attempt:
    await case.prepare()
    threads = set(threading.enumerate())
    directories = [Path(tempfile.gettempdir()), *case.destinations()]
    files = temp_entries(*directories)
    owned = await anyio.to_thread.run_sync(subject.owned)
    attempt = await case.attempt(n)
    problems = [Problem(n, attempt.outcome.value, attempt.error)] * (attempt.outcome in DEFECTS)
    problems += [Problem(n, cause, detail) for cause, detail in await case.check(attempt)]
    new_owned = await anyio.to_thread.run_sync(subject.owned) - owned
    if new_owned:
        problems.append(Problem(n, "provider objects", ", ".join(sorted(new_owned))))
    busy = await busy_threads(threads)
    if busy:
        problems.append(Problem(n, "threads", ", ".join(busy)))
    new_files = temp_entries(*directories) - files
    if new_files:
        problems.append(Problem(n, "temp files", ", ".join(str(p) for p in sorted(new_files))))
    where = f" (cancel requested in {attempt.landed})" if attempt.landed else ""
    report.problems += [Problem(p.n, p.cause, p.detail + where) for p in problems]
    return attempt


class _Case(abc.ABC):
    def __init__(self, subject: Subject) -> None:
        self.subject = subject
        self.session: EnvironmentSession | None = None

    async def cancel_at(
        self, n: int, operation: Callable[[], Coroutine[Any, Any, T]]
    ) -> tuple[Attempt, T | None]:
        return await cancel_at(n, operation, self.subject.owned)

    async def setup(self) -> None:
        return None

    async def prepare(self) -> None:
        """Before each attempt, outside its leak snapshot."""
        return None

    @abc.abstractmethod
    async def attempt(self, n: int) -> Attempt: ...

    async def check(self, attempt: Attempt) -> list[tuple[str, str]]:
        return []

    def destinations(self) -> list[Path]:
        return []

    async def teardown(self) -> None:
        if self.session is not None:
            await self.subject.env.close(self.session)

    async def open(self) -> EnvironmentSession:
        self.session = await self.subject.env.open(self.subject.plan)
        return self.session

    def live(self) -> EnvironmentSession:
        assert self.session is not None, "setup() opens the session"
        return self.session


class _Open(_Case):
    async def attempt(self, n: int) -> Attempt:
        env = self.subject.env
        attempt, session = await self.cancel_at(n, lambda: env.open(self.subject.plan))
        if session is not None:
            await env.close(session)
        return attempt


class _Close(_Case):
    async def prepare(self) -> None:
        await self.open()

    async def attempt(self, n: int) -> Attempt:
        session = self.live()
        attempt, _ = await self.cancel_at(n, lambda: self.subject.env.close(session))
        return attempt

    async def check(self, attempt: Attempt) -> list[tuple[str, str]]:
        return [] if self.live().closed else [("not closed", "close() left the session open")]


class _SessionCase(_Case):
    async def setup(self) -> None:
        await self.open()


class _Exec(_SessionCase):
    tag = ""

    async def setup(self) -> None:
        await super().setup()
        if not await self._processes_visible():
            raise RuntimeError(
                f"{self.subject.provider}: this host does not see the sandbox's processes, "
                "so the campaign's process check would prove nothing"
            )

    async def _processes_visible(self) -> bool:
        tag = f"{_TAG}={secrets.token_hex(8)}"
        unseen = {tag}
        async with anyio.create_task_group() as group:
            group.start_soon(self._run, ["sleep", "30"], tag)
            unseen = await settled(lambda: set() if tagged_processes(tag) else {tag})
            group.cancel_scope.cancel()
        return not unseen and not await settled(lambda: tagged_processes(tag))

    async def _run(self, argv: list[str], tag: str) -> None:
        name, value = tag.split("=", 1)
        await self.live().exec(argv, env={name: value})

    async def attempt(self, n: int) -> Attempt:
        self.tag = f"{_TAG}={secrets.token_hex(8)}"
        attempt, _ = await self.cancel_at(n, lambda: self._run(_EXEC, self.tag))
        return attempt

    async def check(self, attempt: Attempt) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        if attempt.outcome is not Outcome.COMPLETED and attempt.returned_after_s > PROMPT_S:
            late = f"the command ran on {attempt.returned_after_s:.1f} s after the cancellation"
            found.append(("slow to cancel", late))
        pids = await settled(lambda: tagged_processes(self.tag))
        return [*found, ("processes", f"pids {pids} still carry {self.tag}")] if pids else found


def _make_tree(root: Path) -> dict[str, bytes]:
    """A small tree of nested directories and files; returns its contents by path."""
    contents: dict[str, bytes] = {}
    for i in range(12):
        relative = f"d{i % 3}/e{i % 2}/f{i}.bin"
        data = secrets.token_bytes(4096 * (i + 1))
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        contents[relative] = data
    return contents


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


class _Upload(_SessionCase):
    async def setup(self) -> None:
        await super().setup()
        self.source = self.subject.scratch / "upload-source"
        _make_tree(self.source)

    async def attempt(self, n: int) -> Attempt:
        session = self.live()
        attempt, _ = await self.cancel_at(n, lambda: session.upload_dir(self.source, f"up-{n}"))
        return attempt


class _Download(_SessionCase):
    async def setup(self) -> None:
        await super().setup()
        source = self.subject.scratch / "download-source"
        self.expected = _make_tree(source)
        await self.live().upload_dir(source, "tree")
        self.parent = self.subject.scratch / "downloads"
        self.parent.mkdir()

    def destinations(self) -> list[Path]:
        return [self.parent]

    async def attempt(self, n: int) -> Attempt:
        session = self.live()
        attempt, _ = await self.cancel_at(
            n, lambda: session.download_dir("tree", self.parent / str(n))
        )
        return attempt

    async def check(self, attempt: Attempt) -> list[tuple[str, str]]:
        destination = self.parent / str(attempt.n)
        if not destination.exists() or _tree(destination) == self.expected:
            return []
        return [("partial download", f"{destination} holds part of the tree")]


def reaches(policy: NetworkPolicy, target: EgressTarget) -> bool:
    """Whether `policy` lets a connection to `target` through."""
    if policy.network_mode in (NetworkMode.PUBLIC, NetworkMode.NO_NETWORK):
        return policy.network_mode is NetworkMode.PUBLIC
    listed = str(target) in {str(t) for t in policy.targets}
    return listed if policy.network_mode is NetworkMode.ALLOWLIST else not listed


class _Switch(_Case):
    async def prepare(self) -> None:
        old = self.subject.switch[0]
        if self.session is None or self.session.closed:
            await self.open()
        elif self.live().policy != old:
            await self.live().set_network_policy(old)

    async def attempt(self, n: int) -> Attempt:
        session, new = self.live(), self.subject.switch[1]
        attempt, _ = await self.cancel_at(n, lambda: session.set_network_policy(new))
        return attempt

    async def check(self, attempt: Attempt) -> list[tuple[str, str]]:
        session = self.live()
        if session.closed:
            return []  # a switch that could not fall back closes the sandbox: closed is fine
        old, new = self.subject.switch
        allowed = [old, NetworkPolicy.no_network()]
        if attempt.outcome is not Outcome.CANCELLED:
            allowed.append(new)  # only a switch that ran to its end may have put it in force
        if session.policy not in allowed:
            return [("policy mix", f"the session reports {session.policy}")]
        targets = self.subject.targets
        expected = [reaches(session.policy, t) for t in targets]
        seen = [await self._connects(t) for t in targets]
        if seen == expected:
            return []
        pairs = zip(targets, seen, strict=True)
        shown = ", ".join(f"{t}: {'open' if ok else 'closed'}" for t, ok in pairs)
        return [("policy mix", f"the session reports {session.policy}, but {shown}")]

    async def _connects(self, target: EgressTarget) -> bool:
        result = await self.live().exec(self.subject.connect(target), timeout=15)
        return result.returncode == 0


_CASES: dict[str, Callable[[Subject], _Case]] = {
    "open": _Open,
    "close": _Close,
    "set_network_policy": _Switch,
    "exec": _Exec,
    "upload_dir": _Upload,
    "download_dir": _Download,
}


def markdown(reports: list[Report]) -> str:
    """The campaign's summary: one row per provider and operation, a total per provider."""
    lines = [
        "| provider | operation | cases | faults injected | raised the cancellation "
        "| returned under a shield | slowest return after the cancel | failures (by cause) "
        "| leaks |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for provider in dict.fromkeys(r.provider for r in reports):
        mine = [r for r in reports if r.provider == provider]
        for name, group in [*((r.operation, [r]) for r in mine), ("**all**", mine)]:
            attempts = [a for r in group for a in r.attempts]
            failures = [p.cause for r in group for p in r.failures]
            causes = ", ".join(f"{failures.count(c)} {c}" for c in dict.fromkeys(failures))
            cells = [
                provider,
                name,
                len(attempts),
                sum(r.faults for r in group),
                sum(a.outcome is Outcome.CANCELLED for a in attempts),
                sum(a.outcome is Outcome.UNDELIVERED for a in attempts),
                f"{max((a.returned_after_s for a in attempts), default=0.0):.2f} s",
                causes or "0",
                sum(len(r.leaks) for r in group),
            ]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)
