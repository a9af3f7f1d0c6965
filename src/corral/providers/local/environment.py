"""The `local` provider: the embedded default, no daemon needed.

It runs commands as process trees on this host. It is not a security boundary for the
filesystem: a command can read and write anything the host user can. Its one enforced
network restriction is `no-network`, through a fresh network namespace per exec, and it
is declared only where a probe shows the host allows one (root, or unprivileged user
namespaces). Every exec of a session runs in the session's own cgroup where the host lets
corral make one (root), else in the session's own PID namespace (any user, where user
namespaces are allowed); `end_workload` and `close` end everything in it.
"""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import anyio

from corral.core.environment import BaseEnvironment
from corral.core.labels import new_session_id
from corral.core.plan import ExecutionPlan
from corral.core.redact import plain_env
from corral.core.session import EnvironmentSession
from corral.core.snapshot import SnapshotRef
from corral.core.snapshot_store import SnapshotShelf, cache_dir, default_root
from corral.errors import FeatureUnsupported
from corral.helper import helper_binary
from corral.network.capabilities import NetworkCapabilities
from corral.network.policy import NetworkMode
from corral.providers.local.cgroup import SessionCgroup, cgroup_available
from corral.providers.local.config import LocalConfig
from corral.providers.local.ledger import SessionLedger
from corral.providers.local.netns import netns_available
from corral.providers.local.paths import host_path
from corral.providers.local.pidns import SessionPidNamespace, pidns_available
from corral.providers.local.session import LocalSession


class _ProbedModes:
    """`supported_network_modes`, decided by probing the host once, on first use."""

    def __get__(self, obj: object, owner: type | None = None) -> frozenset[NetworkMode]:
        if netns_available():
            return frozenset({NetworkMode.PUBLIC, NetworkMode.NO_NETWORK})
        return frozenset({NetworkMode.PUBLIC})


class _ProbedSwitch:
    """`supports_dynamic_network_policy`: only where every process of a session can be
    seen, so a switch can be refused while one started under the old policy lives on."""

    def __get__(self, obj: object, owner: type | None = None) -> bool:
        return NetworkMode.NO_NETWORK in _ProbedModes().__get__(obj, owner) and (
            cgroup_available() or pidns_available()
        )


class _ProbedProcesses:
    """`supports_processes` and `supports_pty`: where this installation carries corral's
    helper (the process manager) and the session's processes can be held (a cgroup or a
    PID namespace), so that a phase's end ends them."""

    def __get__(self, obj: object, owner: type | None = None) -> bool:
        return helper_binary(platform.machine()) is not None and (
            cgroup_available() or pidns_available()
        )


def _probe_host() -> None:
    netns_available()
    cgroup_available()
    pidns_available()


class LocalEnvironment(BaseEnvironment):
    id: ClassVar[str] = "local"
    config_model = LocalConfig
    supported_network_modes = _ProbedModes()  # type: ignore[assignment]
    supports_dynamic_network_policy = _ProbedSwitch()  # type: ignore[assignment]
    isolates_sessions = False  # processes of one host share its network
    # A session lives as long as the process that opened it (its cgroup and children are
    # that process's), so another process cannot reattach; a saved workspace can be forked.
    supports_snapshot = True
    supports_processes = _ProbedProcesses()  # type: ignore[assignment]
    supports_pty = _ProbedProcesses()  # type: ignore[assignment]

    config: LocalConfig

    @classmethod
    def network_capabilities(cls) -> NetworkCapabilities:
        return NetworkCapabilities(
            provider=cls.id,
            modes=cls.supported_network_modes,
            dynamic=cls.supports_dynamic_network_policy,
        )

    async def _probe_host(self) -> None:
        # Each probe may start `unshare`: in a worker thread, once per process.
        await anyio.to_thread.run_sync(_probe_host)

    async def _open(
        self, plan: ExecutionPlan, owned: AsyncExitStack, *, session_id: str | None
    ) -> EnvironmentSession:
        session_id = session_id or new_session_id()
        ledger = self._ledger()
        # First in, so last out: the record goes once all it names has.
        owned.callback(ledger.drop, session_id)
        root = self.config.root_dir or Path(tempfile.gettempdir())
        # Resolved: every sandbox path is held inside it (`paths.host_path`).
        workspace = await _made(
            lambda: Path(tempfile.mkdtemp(prefix=f"corral-{session_id}-", dir=root)).resolve()
        )
        owned.push_async_callback(_remove_tree, workspace)
        tmp_dir = workspace / ".tmp"
        tmp_dir.mkdir()
        workdir = host_path(workspace, workspace, plan.workdir) if plan.workdir else workspace
        workdir.mkdir(parents=True, exist_ok=True)
        inherited = {k: os.environ[k] for k in self.config.inherit_env if k in os.environ}
        env: dict[str, Any] = {
            **inherited,
            "HOME": str(workspace),
            "TMPDIR": str(tmp_dir),
            **plain_env(plan.env),
        }
        processes = await _made(lambda: _session_processes(session_id))
        if not isinstance(processes, FeatureUnsupported):
            owned.push_async_callback(processes.remove, self.config.end_workload_timeout_s)
        cgroup = processes.path if isinstance(processes, SessionCgroup) else None
        await anyio.to_thread.run_sync(ledger.write, session_id, workspace, cgroup)
        session = LocalSession(
            id=session_id,
            policy=plan.network.baseline,
            workspace=workspace,
            workdir=workdir,
            env=env,
            default_timeout=plan.timeouts.operation_s,
            output_limit=self.config.output_limit_bytes,
            tree=processes,
            end_workload_timeout_s=self.config.end_workload_timeout_s,
            shelf=self._shelf(),
        )
        owned.push_async_callback(session.procs.aclose)
        return session

    async def _restore(self, session: EnvironmentSession, ref: SnapshotRef) -> None:
        assert isinstance(session, LocalSession)
        shelf = self._shelf()
        record = await anyio.to_thread.run_sync(shelf.load, ref)
        tree = shelf.tree(record.id, 0)
        await anyio.to_thread.run_sync(
            lambda: shutil.copytree(tree, session.workspace, symlinks=True, dirs_exist_ok=True)
        )

    async def _discard_snapshot(self, ref: SnapshotRef) -> None:
        await anyio.to_thread.run_sync(self._shelf().remove, ref)

    async def gc(self) -> list[str]:
        """Expired snapshots, and what the sessions of a harness that died left."""
        removed = await anyio.to_thread.run_sync(self._shelf().collect)
        ledger = self._ledger()
        for record in await anyio.to_thread.run_sync(ledger.abandoned):
            cgroup = record.removable_cgroup()
            if cgroup is not None:
                await SessionCgroup(cgroup).remove(self.config.end_workload_timeout_s)
            workspace = record.removable_workspace()
            if workspace is not None:
                await _remove_tree(workspace)
            ledger.drop(record.id)
            held = cgroup is not None or workspace is not None
            removed.append(f"session {record.id}" if held else f"session record {record.id}")
        return removed

    def _ledger(self) -> SessionLedger:
        root = self.config.session_dir or cache_dir() / "sessions" / self.id
        return SessionLedger(root, owner=self.config.owner)

    def _shelf(self) -> SnapshotShelf:
        cfg = self.config
        return SnapshotShelf(
            cfg.snapshot_dir or default_root(self.id),
            provider=self.id,
            owner=cfg.owner,
            lifetime_s=cfg.snapshot_lifetime_s,
        )


def _session_processes(
    session_id: str,
) -> SessionCgroup | SessionPidNamespace | FeatureUnsupported:
    """Where the session's processes are kept, or why they cannot be."""
    try:
        return SessionCgroup.create(f"corral-{session_id}")
    except FeatureUnsupported as cgroup_missing:
        try:
            return SessionPidNamespace.start()
        except FeatureUnsupported as pidns_missing:
            return FeatureUnsupported(f"{cgroup_missing}; and {pidns_missing}")


T = TypeVar("T")


async def _made(make: Callable[[], T]) -> T:
    """`make()` in a thread, its result kept if the caller is cancelled meanwhile (a
    dropped result would leak what it made); the cancellation arrives at the next await."""
    made: list[T] = []
    with anyio.CancelScope(shield=True):
        made.append(await anyio.to_thread.run_sync(make))
    return made[0]


async def _remove_tree(path: Path) -> None:
    await anyio.to_thread.run_sync(lambda: shutil.rmtree(path, ignore_errors=True))
