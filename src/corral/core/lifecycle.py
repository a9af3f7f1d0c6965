"""`TaskRun`: a task's sandbox through its phases, baseline → run → evaluation → baseline."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from types import TracebackType
from typing import Any, TypeVar

import anyio

from corral.core.bindings import BoundSet, WorkspaceBinding
from corral.core.environment import BaseEnvironment
from corral.core.logs import event
from corral.core.plan import ExecutionPlan
from corral.core.session import EnvironmentSession
from corral.errors import FeatureUnsupported
from corral.network.events import NetworkEvents, PhaseSummary, summarize
from corral.network.policy import NetworkMode, NetworkPolicy, NetworkSchedule, Phase
from corral.network.targets import NetworkTarget

log = logging.getLogger("corral.lifecycle")

T = TypeVar("T")
PolicyLogEntry = tuple[str, Phase, str]


def with_always_allowed(
    policy: NetworkPolicy, targets: tuple[NetworkTarget, ...], phase: Phase
) -> NetworkPolicy:
    """Merge targets the agent needs in every phase into `policy` (never silently)."""
    if not targets:
        return policy
    mode = policy.network_mode
    if mode is NetworkMode.ALLOWLIST:
        return NetworkPolicy.allowlist(*policy.allowed_hosts, *targets)
    if mode is NetworkMode.NO_NETWORK:
        event(
            log,
            "warning",
            "always_allow turns no-network into an allowlist",
            phase=phase,
            targets=[str(t) for t in targets],
        )
        return NetworkPolicy.allowlist(*targets)
    return policy


class TaskRun:
    """Owns one task's main sandbox and the policy switches between its phases.

    `bindings` (`corral.workspace`) are bound, in order, once the sandbox is open and
    before the run, and finalized after evaluation when the block ends: with outcome
    `"completed"`, or `"failed"` when the block raised (a failure to finalize is then
    attached to that error). A cancelled block abandons them instead. `run.workspaces`
    holds the bound workspaces, `run.snapshots` what finalize returned.
    """

    def __init__(
        self,
        env: BaseEnvironment,
        plan: ExecutionPlan,
        *,
        fresh_evaluation: bool = False,
        always_allow: Iterable[str | NetworkTarget] = (),
        restore_timeout_s: float = 120.0,
        bindings: Sequence[WorkspaceBinding] = (),
    ) -> None:
        allowed = tuple(NetworkTarget.model_validate(t) for t in always_allow)
        schedule = plan.network
        merged = {
            phase: with_always_allowed(policy, allowed, phase) for phase, policy in schedule.items()
        }
        self.env = env
        self.plan = plan.model_copy(update={"network": NetworkSchedule.model_validate(merged)})
        self.fresh_evaluation = fresh_evaluation
        self.restore_timeout_s = restore_timeout_s
        self.policy_log: list[PolicyLogEntry] = []
        #: refused attempts of a fresh evaluation sandbox, kept from before its release
        self._evaluation_events: list[NetworkEvents] = []
        self._session: EnvironmentSession | None = None
        self._refresher = AsyncExitStack()
        self._bindings = BoundSet(bindings)
        self.snapshots: list[Any] = []

    @property
    def schedule(self) -> NetworkSchedule:
        return self.plan.network

    @property
    def session(self) -> EnvironmentSession:
        if self._session is None:
            raise RuntimeError("TaskRun is not entered; use `async with TaskRun(...) as run`")
        return self._session

    @property
    def workspaces(self) -> list[Any]:
        """The bound workspaces, in the order of `bindings`, until they are finalized."""
        return [bound for _, bound in self._bindings.bound]

    async def __aenter__(self) -> TaskRun:
        self._session = session = await self.env.open(self.plan)
        self._record(session, "baseline")
        try:
            await self._bindings.bind(session)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.env.close(session)
            raise
        self._refresher = AsyncExitStack()
        await self._refresher.enter_async_context(session.names_kept_current())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self._refresher.aclose()
            await self._finalize_bindings(exc)
        finally:
            if self._session is not None:
                await self.env.close(self._session)

    async def _finalize_bindings(self, exc: BaseException | None) -> None:
        if isinstance(exc, anyio.get_cancelled_exc_class()):
            self._bindings.abandon()
            return
        try:
            self.snapshots = await self._bindings.finalize("completed" if exc is None else "failed")
        except Exception as failure:
            if exc is None:
                raise
            exc.add_note(f"corral: finalizing the workspaces failed too: {failure!r}")

    @asynccontextmanager
    async def running(self) -> AsyncGenerator[EnvironmentSession]:
        """The agent's run. The policy stays `run` afterwards, through harness shutdown."""
        await self._switch(self.session, "run")
        yield self.session

    async def evaluate(self, fn: Callable[[EnvironmentSession], Awaitable[T]]) -> T:
        if not self.fresh_evaluation:
            return await self._evaluate_on(self.session, fn, restore="baseline")
        plan = self.plan.model_copy(
            update={
                "network": NetworkSchedule(
                    baseline=self.schedule.policy("evaluation_baseline"),
                    run=self.schedule.evaluation,
                    evaluation=self.schedule.evaluation,
                )
            }
        )
        async with self.env.session(plan) as evaluation, evaluation.names_kept_current():
            await self._switch(evaluation, "evaluation_baseline")
            try:
                return await self._evaluate_on(evaluation, fn, restore="evaluation_baseline")
            finally:
                self._keep_events(evaluation)

    def _keep_events(self, session: EnvironmentSession) -> None:
        if not self.env.supports_network_events:
            return
        with contextlib.suppress(FeatureUnsupported):
            self._evaluation_events.append(session.network_events())

    def network_summary(self) -> dict[str, PhaseSummary]:
        """The refused attempts and admitted flows of this task, per phase
        (`corral.network.events`): the main
        sandbox's (its newest `limit`), and a fresh evaluation sandbox's. Also after the
        block has ended. `FeatureUnsupported` where the provider cannot see refusals."""
        return summarize([self.session.network_events(), *self._evaluation_events])

    async def _evaluate_on(
        self,
        session: EnvironmentSession,
        fn: Callable[[EnvironmentSession], Awaitable[T]],
        *,
        restore: Phase,
    ) -> T:
        if session is self._session:
            # Whatever the agent left running dies before the evaluation policy applies.
            await session.end_workload()
        await self._switch(session, "evaluation")
        try:
            result = await fn(session)
        except BaseException as primary:
            await self._restore(session, restore, primary)
            raise
        await self._restore(session, restore, None)
        return result

    async def _restore(
        self, session: EnvironmentSession, phase: Phase, primary: BaseException | None
    ) -> None:
        with anyio.CancelScope(shield=True):
            try:
                # A hung switch must not hang the harness: bounded, then an error.
                with anyio.fail_after(self.restore_timeout_s):
                    await session.end_workload()
                    await self._switch(session, phase)
            except Exception as failure:
                if primary is None:
                    raise
                primary.add_note(f"corral: restoring the {phase!r} policy failed: {failure!r}")
                setattr(primary, "restore_error", failure)  # noqa: B010
                event(
                    log,
                    "error",
                    "restore failed",
                    sandbox=session.id,
                    phase=phase,
                    error=repr(failure),
                )

    async def _switch(self, session: EnvironmentSession, phase: Phase) -> None:
        policy = self.schedule.policy(phase)
        started = anyio.current_time()
        if policy != session.policy or phase != session.phase:
            await session.set_network_policy(policy, phase=phase)
        self._record(session, phase)
        event(
            log,
            "info",
            "phase",
            sandbox=session.id,
            phase=phase,
            mode=policy.network_mode.value,
            duration_s=round(anyio.current_time() - started, 4),
        )

    def _record(self, session: EnvironmentSession, phase: Phase) -> None:
        self.policy_log.append((session.id, phase, session.policy.network_mode.value))
