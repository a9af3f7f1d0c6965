"""An in-memory dynamic provider for unit tests of the base lifecycle (never the only test)."""

from __future__ import annotations

import itertools
from contextlib import AsyncExitStack
from pathlib import Path
from typing import ClassVar

import anyio

from corral.core.environment import BaseEnvironment
from corral.core.plan import ExecutionPlan
from corral.core.session import EnvironmentSession, ExecRequest, ExecResult
from corral.errors import SessionIdTaken, WorkloadNotStopped
from corral.network.policy import NetworkMode, NetworkPolicy
from corral.network.targets import EntryType

_ids = itertools.count()


class FakeSession(EnvironmentSession):
    def __init__(self, env: FakeEnvironment, policy: NetworkPolicy, id: str | None = None) -> None:
        super().__init__(id=id or f"fake{next(_ids):08d}", policy=policy)
        self.fake = env
        # Every request `_exec` received, in call order.
        self.requests: list[ExecRequest] = []

    async def _exec(self, request: ExecRequest) -> ExecResult:
        self.requests.append(request)
        return ExecResult(returncode=0, stdout="", stderr="", duration_s=0.0)

    async def _upload(self, local: Path, remote: str, service: str | None) -> None:
        raise NotImplementedError

    async def _download(
        self, remote: str, local: Path, service: str | None, max_bytes: int | None
    ) -> None:
        raise NotImplementedError

    async def _upload_dir(self, local_dir: Path, remote_dir: str, service: str | None) -> None:
        raise NotImplementedError

    async def _download_dir(self, remote_dir: str, local_dir: Path, service: str | None) -> None:
        raise NotImplementedError

    async def _apply_network_policy(self, policy: NetworkPolicy) -> None:
        if self.fake.hang_switch and policy.network_mode is not NetworkMode.NO_NETWORK:
            await anyio.sleep_forever()
        if policy.network_mode in self.fake.fail_modes:
            raise RuntimeError(f"cannot apply {policy.network_mode.value}")
        self.fake.calls.append((self.id, policy.network_mode.value))

    async def _end_workload(self) -> None:
        self.fake.calls.append((self.id, "end_workload"))
        if self.fake.workload_survives:
            raise WorkloadNotStopped("a process survived")


class FakeEnvironment(BaseEnvironment):
    """Creates `steps` named resources; can fail or hang at a given step, fail to apply
    some modes, or fail to end a phase's processes."""

    id: ClassVar[str] = "fake"
    session_type: ClassVar[type[FakeSession]] = FakeSession
    supported_network_modes = frozenset(NetworkMode)
    supported_allowlist_entry_types = frozenset(EntryType)
    supports_network_target_ports = True
    supports_dynamic_network_policy = True
    max_concurrent_opens = 2

    def __init__(
        self,
        *,
        steps: int = 3,
        fail_at: int | None = None,
        hang_at: int | None = None,
        fail_modes: frozenset[NetworkMode] = frozenset(),
        workload_survives: bool = False,
    ) -> None:
        super().__init__()
        self.steps = steps
        self.fail_at = fail_at
        self.hang_at = hang_at
        self.fail_modes = fail_modes
        self.workload_survives = workload_survives
        self.live: set[str] = set()
        # (session id, mode applied or "end_workload"), in call order.
        self.calls: list[tuple[str, str]] = []
        self.hang_switch = False
        self.concurrent = 0
        self.max_seen = 0

    async def _open(
        self, plan: ExecutionPlan, owned: AsyncExitStack, *, session_id: str | None
    ) -> EnvironmentSession:
        self.concurrent += 1
        self.max_seen = max(self.max_seen, self.concurrent)
        try:
            for step in range(self.steps):
                if step == self.fail_at:
                    raise RuntimeError(f"step {step} failed")
                if step == self.hang_at:
                    await anyio.sleep_forever()
                await anyio.sleep(0.01)
                name = f"resource-{next(_ids)}-{step}"
                self.live.add(name)
                owned.callback(self.live.discard, name)
            return self.session_type(self, plan.network.baseline)
        finally:
            self.concurrent -= 1


class Sandboxes:
    """What a provider's engine would hold: live sandboxes by session id, shared by every
    environment object (standing in for other processes), each with its enforced policy."""

    def __init__(self) -> None:
        self.policies: dict[str, NetworkPolicy] = {}
        self.opening: set[str] = set()
        self.creates = 0


class ReattachableSession(FakeSession):
    async def _apply_network_policy(self, policy: NetworkPolicy) -> None:
        await super()._apply_network_policy(policy)
        assert isinstance(self.fake, ReattachableEnvironment)
        self.fake.sandboxes.policies[self.id] = policy


class ReattachableEnvironment(FakeEnvironment):
    """A fake whose sandboxes outlive the environment object, found again by session id."""

    session_type = ReattachableSession
    supports_reattach = True

    def __init__(self, sandboxes: Sandboxes, *, open_delay_s: float = 0.0) -> None:
        super().__init__(steps=1)
        self.sandboxes = sandboxes
        self.open_delay_s = open_delay_s

    async def _open(
        self, plan: ExecutionPlan, owned: AsyncExitStack, *, session_id: str | None
    ) -> EnvironmentSession:
        held = self.sandboxes
        sid = session_id or f"fake{next(_ids):08d}"
        if sid in held.policies or sid in held.opening:
            raise SessionIdTaken(f"session id {sid!r} exists")
        held.opening.add(sid)
        held.creates += 1
        owned.callback(held.opening.discard, sid)
        owned.callback(held.policies.pop, sid, None)
        await anyio.sleep(self.open_delay_s)
        held.policies[sid] = plan.network.baseline
        held.opening.discard(sid)
        return ReattachableSession(self, plan.network.baseline, sid)

    async def _reattach(self, session_id: str) -> tuple[EnvironmentSession, AsyncExitStack] | None:
        policy = self.sandboxes.policies.get(session_id)
        if policy is None:
            return None
        owned = AsyncExitStack()
        owned.callback(self.sandboxes.policies.pop, session_id, None)
        return ReattachableSession(self, policy, session_id), owned
