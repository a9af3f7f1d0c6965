"""One class per operation: its setup, one attempt at N, and what only it can check."""

from __future__ import annotations

import abc
import secrets
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import anyio

from corral.core.session import EnvironmentSession
from corral.network.policy import NetworkMode, NetworkPolicy
from corral.testing.campaign.subject import Subject
from corral.testing.checkpoints import Attempt, Outcome, cancel_at
from corral.testing.leftovers import settled, tagged_processes
from corral.testing.plugin import EgressTarget

OPERATIONS = ("open", "close", "set_network_policy", "exec", "upload_dir", "download_dir")
T = TypeVar("T")
_TAG = "CORRAL_CAMPAIGN"
#: The exec under test outlives `PROMPT_S`, so that one that only returns when its command
#: ends is told apart from one that stops it.
_EXEC = ["sh", "-c", "sleep 3 & echo out; echo err >&2; wait"]
PROMPT_S = 2.0


class Case(abc.ABC):
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


class _Open(Case):
    async def attempt(self, n: int) -> Attempt:
        env = self.subject.env
        attempt, session = await self.cancel_at(n, lambda: env.open(self.subject.plan))
        if session is not None:
            await env.close(session)
        return attempt


class _Close(Case):
    async def prepare(self) -> None:
        await self.open()

    async def attempt(self, n: int) -> Attempt:
        session = self.live()
        attempt, _ = await self.cancel_at(n, lambda: self.subject.env.close(session))
        return attempt

    async def check(self, attempt: Attempt) -> list[tuple[str, str]]:
        return [] if self.live().closed else [("not closed", "close() left the session open")]


class _SessionCase(Case):
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
            group.start_soon(self._run, ["sleep", "10"], tag)
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


class _Switch(Case):
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


CASES: dict[str, Callable[[Subject], Case]] = {
    "open": _Open,
    "close": _Close,
    "set_network_policy": _Switch,
    "exec": _Exec,
    "upload_dir": _Upload,
    "download_dir": _Download,
}
