"""Raising N until an operation completes, and checking what each attempt left."""

from __future__ import annotations

import itertools
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from corral.testing.campaign.cases import CASES, Case
from corral.testing.campaign.subject import Subject
from corral.testing.checkpoints import DEFECTS, Attempt, Outcome
from corral.testing.leftovers import busy_threads, temp_entries

#: Causes that are leaks (the rest of `Problem.cause` values are failures).
LEAKS = ("provider objects", "threads", "temp files", "processes")
#: A path that never completes is a defect of its own, not a reason to run forever.
HARD_LIMIT_N = 2000


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
    attempts: list[Attempt] = []
    problems: list[Problem] = []
    completed = False
    case = CASES[operation](subject)
    threads = set(threading.enumerate())
    await case.setup()
    try:
        for n in itertools.count(1):
            if (subject.max_n is not None and n > subject.max_n) or n > HARD_LIMIT_N:
                break
            attempt = await _checked(subject, case, n, problems)
            attempts.append(attempt)
            if attempt.outcome is Outcome.COMPLETED:
                completed = True
                break
    finally:
        with anyio.CancelScope(shield=True):
            await case.teardown()
    busy = await busy_threads(threads)
    if busy:
        problems.append(Problem(0, "threads", f"after the campaign: {', '.join(busy)}"))
    left = await anyio.to_thread.run_sync(subject.owned)
    if left:
        problems.append(Problem(0, "provider objects", f"after the campaign: {left}"))
    if not completed and subject.max_n is None:
        last = len(attempts)
        problems.append(Problem(last, "never completed", f"still cancelled at N={last}"))
    return Report(subject.provider, operation, attempts, problems, completed)


async def _checked(subject: Subject, case: Case, n: int, found: list[Problem]) -> Attempt:
    """Attempt `n`, with what it left or broke added to `found`."""
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
    session = case.session
    live = frozenset({session.id} if session is not None and not session.closed else ())
    busy = await busy_threads(threads, live_sessions=live)
    if busy:
        problems.append(Problem(n, "threads", ", ".join(busy)))
    new_files = temp_entries(*directories) - files
    if new_files:
        problems.append(Problem(n, "temp files", ", ".join(str(p) for p in sorted(new_files))))
    where = f" (cancel requested in {attempt.landed})" if attempt.landed else ""
    found.extend(Problem(p.n, p.cause, p.detail + where) for p in problems)
    return attempt
