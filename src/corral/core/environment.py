"""`BaseEnvironment`: the lifecycle every provider shares, with `open`/`close` final.

A provider implements `_open(plan, owned)` and pushes an undo callback onto `owned`
right after it creates each resource. The base owns the startup deadline, the per-provider
open limiter, admission (`core/admission.py`), the shielded unwinding of `owned` on failure
or cancellation, and hands `owned` to the session so that `close()` unwinds exactly the same list.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import AsyncGenerator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, ClassVar, Self

import anyio

from corral.core.admission import Admission
from corral.core.blocking import cleanup_bound, limiter
from corral.core.config import RuntimeEnvironmentConfig
from corral.core.labels import checked_session_id
from corral.core.logs import event
from corral.core.plan import RECIPES, ExecutionPlan, RecipeRegistry
from corral.core.registry import EnvironmentRegistry
from corral.core.session import EnvironmentSession
from corral.core.snapshot import EnvironmentFeatures, SnapshotRef
from corral.errors import (
    ConfigError,
    FeatureUnsupported,
    SessionIdTaken,
    SessionNotFound,
    StartupTimeout,
)
from corral.network.capabilities import NetworkCapabilities
from corral.network.policy import NetworkMode
from corral.network.targets import EntryType

log = logging.getLogger("corral.environment")

#: How long a shielded cleanup may work; the time it queues for worker threads behind
#: other sessions' calls is not counted, but it ends by the ceiling whatever the queue.
CLEANUP_TIMEOUT_S = 120.0
CLEANUP_CEILING_S = 1200.0


class BaseEnvironment(abc.ABC):
    """A provider of sandboxes: `open(plan)` makes a session, `close(session)` removes
    exactly what it made (both final here; a provider implements `_open` and the hooks).

    Built from its config model (`config_model`, or its fields as keyword arguments);
    what it can do is declared by the class attributes below, read through `features()`
    and `network_capabilities()`, and checked before anything is created.
    """

    id: ClassVar[str]
    config_model: ClassVar[type[RuntimeEnvironmentConfig]] = RuntimeEnvironmentConfig
    supported_network_modes: ClassVar[frozenset[NetworkMode]] = frozenset({NetworkMode.PUBLIC})
    supported_allowlist_entry_types: ClassVar[frozenset[EntryType]] = frozenset()
    #: entry types a denylist may use; None: the same as an allowlist
    supported_denylist_entry_types: ClassVar[frozenset[EntryType] | None] = None
    supports_network_target_ports: ClassVar[bool] = False
    supports_dynamic_network_policy: ClassVar[bool] = False
    #: Whether a sandbox refuses every connection another sandbox opens to it, in every
    #: mode. A provider whose sessions share one network (`local`) declares False; the
    #: conformance suite holds every other provider to it.
    isolates_sessions: ClassVar[bool] = True
    #: `open(plan, session_id=…)` and `attach(id)` find a live sandbox, also one another
    #: process opened (`_reattach`).
    supports_reattach: ClassVar[bool] = False
    #: `session.save()` and `fork(ref, plan)` (`_save`, `_from_snapshot`, `_restore`).
    supports_snapshot: ClassVar[bool] = False
    supports_services: ClassVar[bool] = False
    supports_network_events: ClassVar[bool] = False
    #: `session.start`, `session.shell`, `session.processes()` (`_process_manager`)
    supports_processes: ClassVar[bool] = False
    supports_pty: ClassVar[bool] = False
    #: `plan.credentials`: routes through corral's proxy (`corral.core.credentials`)
    supports_credentials: ClassVar[bool] = False
    max_concurrent_opens: ClassVar[int] = 16

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in ("open", "close"):
            if name in cls.__dict__:
                raise TypeError(
                    f"{cls.__name__} overrides {name}(), which is final on BaseEnvironment; "
                    "implement _open(plan, owned) and push undo callbacks onto owned instead"
                )

    def __init__(
        self,
        config: RuntimeEnvironmentConfig | None = None,
        *,
        recipes: RecipeRegistry | None = None,
        **params: Any,
    ) -> None:
        if config is not None and params:
            raise ConfigError("pass either a config object or keyword parameters, not both")
        if config is None:
            config = self.config_model.model_validate(params)
        elif not isinstance(config, self.config_model):
            raise ConfigError(
                f"provider {self.id!r} needs a {self.config_model.__name__}, "
                f"got {type(config).__name__}"
            )
        self.config = config
        self.recipes = RECIPES if recipes is None else recipes

    def __repr__(self) -> str:
        return f"<{type(self).__name__} id={self.id!r}>"

    @classmethod
    def network_capabilities(cls) -> NetworkCapabilities:
        """Which modes, entry types and switches this provider enforces; a policy outside
        them is refused at `open()` or at the switch, naming what is missing."""
        return NetworkCapabilities(
            provider=cls.id,
            modes=cls.supported_network_modes,
            entry_types=cls.supported_allowlist_entry_types,
            denylist_entry_types=cls.supported_denylist_entry_types,
            target_ports=cls.supports_network_target_ports,
            dynamic=cls.supports_dynamic_network_policy,
        )

    @classmethod
    def features(cls) -> EnvironmentFeatures:
        """What this provider supports beyond exec and files (reattach, snapshots,
        services, network events, processes, terminals, credential routes), as installed:
        a feature that needs corral's helper binary is reported only where it ships."""
        return EnvironmentFeatures(
            provider=cls.id,
            supports_reattach=cls.supports_reattach,
            supports_snapshot=cls.supports_snapshot,
            supports_services=cls.supports_services,
            supports_network_events=cls.supports_network_events,
            supports_processes=cls.supports_processes,
            supports_pty=cls.supports_pty,
            supports_credentials=cls.supports_credentials,
        )

    @classmethod
    def engine_answers(cls) -> bool:
        """Whether the provider's engine or cluster answers with default settings."""
        return True

    async def _probe_host(self) -> None:
        """Learn, off the event loop, whatever the capability attributes read from this
        host (a provider whose capabilities depend on it probes here, once per process);
        `open()` and `attach()` await it before they read one. Nothing, by default."""
        return

    def default_demo_image(self) -> str | None:
        """The image `corral demo` uses when none is given."""
        return None

    def prepare(self, plan: ExecutionPlan) -> ExecutionPlan:
        """Apply the matching recipe, resolve image and resources, check the schedule."""
        plan = self.recipes.apply(plan, self.id).resolved()
        self.network_capabilities().check_schedule(plan.network)
        if plan.services:
            self._require(
                f"services (the plan names {', '.join(plan.services)})", self.supports_services
            )
        if plan.credentials:
            self._require(
                f"credentials (the plan routes {', '.join(plan.credentials)})",
                self.supports_credentials,
            )
        return plan

    async def open(
        self,
        plan: ExecutionPlan,
        *,
        session_id: str | None = None,
        from_snapshot: SnapshotRef | None = None,
    ) -> EnvironmentSession:
        """A new sandbox under the plan's baseline policy.

        With `session_id`, opening is idempotent: a live sandbox with that id (opened by
        any process) is reattached as it is, with the policy it has; it is never
        duplicated. With `from_snapshot`, the sandbox starts from a saved state (`fork`).
        """
        await self._probe_host()
        if session_id is not None:
            session_id = checked_session_id(session_id)
            self._require("reattach", self.supports_reattach)
            found = await self._reattach(session_id)
            if found is not None:
                return self._adopt(*found, how="reattached")
        if from_snapshot is not None:
            self._check_snapshot(from_snapshot)
            plan = await self._from_snapshot(from_snapshot, plan)
        plan = self.prepare(plan)
        try:
            return await self._open_new(plan, session_id, from_snapshot)
        except SessionIdTaken:
            assert session_id is not None
            return await self._await_other_open(session_id, plan.timeouts.startup_s)

    async def attach(self, session_id: str) -> EnvironmentSession:
        """A working session for the live sandbox `session_id`, with the policy read back
        from the provider; `SessionNotFound` if there is none. Closing it removes the
        sandbox, as closing the session that opened it would."""
        session_id = checked_session_id(session_id)
        await self._probe_host()
        self._require("reattach", self.supports_reattach)
        found = await self._reattach(session_id)
        if found is None:
            raise SessionNotFound(session_id, f" for provider {self.id!r}")
        return self._adopt(*found, how="attached")

    async def fork(self, ref: SnapshotRef, plan: ExecutionPlan) -> EnvironmentSession:
        """A new sandbox started from `ref`: its own id and schedule, the plan's baseline
        policy, none of the parent's processes."""
        return await self.open(plan, from_snapshot=ref)

    async def discard_snapshot(self, ref: SnapshotRef) -> None:
        """Remove what snapshot `ref` keeps, before it expires. One already gone (expired
        and collected, or discarded) is no error; forks made from it keep running."""
        self._check_snapshot(ref)
        await self._discard_snapshot(ref)

    def _check_snapshot(self, ref: SnapshotRef) -> None:
        self._require("snapshot", self.supports_snapshot)
        if ref.provider != self.id:
            raise ConfigError(
                f"snapshot {ref.id!r} was saved by provider {ref.provider!r}, not {self.id!r}"
            )

    async def _open_new(
        self, plan: ExecutionPlan, session_id: str | None, snapshot: SnapshotRef | None
    ) -> EnvironmentSession:
        opt_ins = self.config.opt_ins()
        if opt_ins:
            event(log, "warning", "unsafe configuration in force", provider=self.id, **opt_ins)
        started = anyio.current_time()
        owned = AsyncExitStack()
        try:
            async with limiter(f"open:{self.id}", self.max_concurrent_opens):
                await Admission(self.id, self.config).admit()
                try:
                    with anyio.fail_after(plan.timeouts.startup_s):
                        session = await self._open(plan, owned, session_id=session_id)
                        if snapshot is not None:
                            await self._restore(session, snapshot)
                except TimeoutError as exc:
                    raise StartupTimeout(
                        f"provider {self.id!r} did not open a sandbox within "
                        f"timeouts.startup_s={plan.timeouts.startup_s}"
                    ) from exc
        except BaseException as exc:
            await _unwind(owned, exc)
            event(
                log,
                "warning",
                "open failed",
                provider=self.id,
                error=type(exc).__name__,
                duration_s=round(anyio.current_time() - started, 3),
            )
            raise
        session.owned_by(self, owned)
        event(
            log,
            "info",
            "sandbox opened",
            provider=self.id,
            sandbox=session.id,
            image=session.image,
            phase="baseline",
            mode=session.policy.network_mode.value,
            **({"snapshot": snapshot.id} if snapshot else {}),
            duration_s=round(anyio.current_time() - started, 3),
        )
        return session

    async def _await_other_open(self, session_id: str, startup_s: float) -> EnvironmentSession:
        """Another open of the same id won the race: wait for it to finish, then attach."""
        with anyio.move_on_after(startup_s):
            while True:
                found = await self._reattach(session_id)
                if found is not None:
                    return self._adopt(*found, how="reattached")
                await anyio.sleep(0.2)
        raise StartupTimeout(
            f"session_id {session_id!r} is being opened by another caller and was not "
            f"ready within timeouts.startup_s={startup_s}"
        )

    def _adopt(
        self, session: EnvironmentSession, owned: AsyncExitStack, *, how: str
    ) -> EnvironmentSession:
        session.owned_by(self, owned)
        event(
            log,
            "info",
            f"sandbox {how}",
            provider=self.id,
            sandbox=session.id,
            mode=session.policy.network_mode.value,
        )
        return session

    def _require(self, feature: str, supported: bool) -> None:
        if not supported:
            raise FeatureUnsupported(f"provider {self.id!r} does not support {feature}")

    async def close(self, session: EnvironmentSession) -> None:
        """Remove exactly what `session` owns; idempotent and safe under cancellation. The
        removal is shielded, and gives up (logging an error; `corral gc` removes what is
        left once it expires) after `CLEANUP_TIMEOUT_S` of its own work: the time its calls
        wait for a worker thread behind other sessions' counts only toward
        `CLEANUP_CEILING_S`."""
        if session.closed:
            return
        if session.environment is not self:
            raise ConfigError(f"session {session.id!r} was not opened by {self!r}")
        owned = session.closing()
        if owned is None:
            return
        started = anyio.current_time()
        await _unwind(owned, None)
        event(
            log,
            "info",
            "sandbox closed",
            provider=self.id,
            sandbox=session.id,
            duration_s=round(anyio.current_time() - started, 3),
        )

    async def aclose(self) -> None:
        """Release what this environment holds in the harness's process (the engine's or
        the API server's client, its connections and threads). Its sessions are not
        touched (close them first); a later call connects again. `async with env:` does
        this on exit."""
        await anyio.to_thread.run_sync(self._release)

    def _release(self) -> None:  # noqa: B027 (a hook: most providers hold no client)
        """Provider hook (in a worker thread): close the clients this environment made."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @asynccontextmanager
    async def session(self, plan: ExecutionPlan) -> AsyncGenerator[EnvironmentSession]:
        """`async with env.session(plan) as sandbox:` opens it, and closes it on the way
        out, also when the block fails or is cancelled."""
        sandbox = await self.open(plan)
        try:
            yield sandbox
        finally:
            await self.close(sandbox)

    @abc.abstractmethod
    async def _open(
        self, plan: ExecutionPlan, owned: AsyncExitStack, *, session_id: str | None
    ) -> EnvironmentSession:
        """Create the sandbox (named `session_id` when given, else a new id); push an
        undo onto `owned` right after each resource. A sandbox that already carries
        `session_id` raises `SessionIdTaken` before anything is created."""

    async def _reattach(self, session_id: str) -> tuple[EnvironmentSession, AsyncExitStack] | None:
        """The live, fully opened sandbox `session_id` of this owner, and an exit stack that
        removes exactly its resources; None if there is none (or it is still opening)."""
        raise FeatureUnsupported(f"provider {self.id!r} does not support reattach")

    async def _from_snapshot(self, ref: SnapshotRef, plan: ExecutionPlan) -> ExecutionPlan:
        """The plan a fork of `ref` opens with (e.g. the snapshot's image)."""
        return plan

    async def _restore(self, session: EnvironmentSession, ref: SnapshotRef) -> None:
        """Put `ref`'s saved state into the just-opened `session` (before it is returned);
        a provider whose `_from_snapshot` plan already carries it has nothing to do."""
        return None

    async def _discard_snapshot(self, ref: SnapshotRef) -> None:
        """Remove `ref`'s saved state (`discard_snapshot`, after its checks)."""
        raise FeatureUnsupported(f"provider {self.id!r} does not support snapshots")

    async def gc(self) -> list[str]:
        """Remove expired resources carrying this owner's labels; returns what went."""
        return []


async def _unwind(owned: AsyncExitStack, primary: BaseException | None) -> None:
    with cleanup_bound(CLEANUP_TIMEOUT_S, CLEANUP_CEILING_S) as scope:
        try:
            await owned.aclose()
        except Exception as exc:
            if primary is None:
                raise
            primary.add_note(f"corral: cleanup after the failure also failed: {exc!r}")
            event(log, "error", "cleanup failed", error=repr(exc))
    if scope.cancelled_caught:
        log.error(
            "cleanup exceeded %.0f s of its own work or %.0f s in all; resources may remain",
            CLEANUP_TIMEOUT_S,
            CLEANUP_CEILING_S,
        )


ENVIRONMENTS = EnvironmentRegistry(BaseEnvironment)
