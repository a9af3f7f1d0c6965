"""A `local` sandbox: a workspace directory and one process group per exec.

Its processes are kept where a phase's end can reach them all: the session's cgroup
(root), else its PID namespace (`pidns`). Either one also shows whether any is alive,
which is what lets the policy switch: `no-network` is a namespace each exec is started
in, so a switch may not leave a process running under the policy it was started with.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path
from typing import Any

import anyio

from corral.core.paths import resolve_within
from corral.core.processes import ProcessManager, StartRequest
from corral.core.session import (
    READ_TEXT_LIMIT_BYTES,
    EnvironmentSession,
    ExecRequest,
    ExecResult,
)
from corral.core.snapshot import SnapshotRef
from corral.core.snapshot_store import SnapshotRecord, SnapshotShelf
from corral.core.tarsafe import copy_at_most, extract_tar, file_limit, open_regular, pack_dir
from corral.errors import (
    ConfigError,
    FeatureUnsupported,
    NetworkPolicyUnsupported,
    RemotePathNotFound,
)
from corral.helper.procs import ProcessClient
from corral.network.policy import NetworkMode, NetworkPolicy
from corral.providers.local import procs
from corral.providers.local.cgroup import SessionCgroup
from corral.providers.local.netns import isolated
from corral.providers.local.paths import host_path
from corral.providers.local.pidns import SessionPidNamespace
from corral.providers.local.process import run_process


class LocalSession(EnvironmentSession):
    def __init__(
        self,
        *,
        id: str,
        policy: NetworkPolicy,
        workspace: Path,
        workdir: Path,
        env: dict[str, str],
        default_timeout: float | None,
        output_limit: int,
        tree: SessionCgroup | SessionPidNamespace | FeatureUnsupported,
        end_workload_timeout_s: float,
        shelf: SnapshotShelf,
    ) -> None:
        super().__init__(id=id, policy=policy, image="host")
        self.workspace = workspace
        self.workdir = workdir
        self.tmp_dir = workspace / ".tmp"
        self._env = env
        self.default_timeout = default_timeout
        self.output_limit = output_limit
        # Every exec joins the cgroup or enters the namespace; where neither could be
        # made, this says why.
        self.tree = tree
        self._end_workload_timeout_s = end_workload_timeout_s
        self._shelf = shelf
        cgroup = tree.path if isinstance(tree, SessionCgroup) else None
        self.procs = ProcessClient(
            functools.partial(procs.connect, env=env, cgroup=cgroup, sandbox_id=id),
            self._place,
            sandbox_id=id,
        )

    def resolve_tmp_path(self, relative: str) -> Path:
        """A path inside the session's tmp dir; absolute paths and `..` are refused."""
        return resolve_within(self.tmp_dir, relative)

    def _path(self, remote: str, *, follow: bool = True) -> Path:
        return host_path(self.workspace, self.workdir, remote, follow=follow)

    def _placed(self, args: tuple[str, ...], cwd: str | None) -> tuple[list[str], Path]:
        """Where a command of this session runs: its argv in the session's namespaces,
        its directory inside the session's root."""
        argv = list(args)
        if self.policy.network_mode is NetworkMode.NO_NETWORK:
            argv = isolated(argv)
        if isinstance(self.tree, SessionPidNamespace):
            argv = self.tree.enter(argv)
        directory = self._path(cwd) if cwd is not None else self.workdir
        if not directory.is_dir():
            raise RemotePathNotFound(str(directory))
        return argv, directory

    def _place(self, request: StartRequest) -> dict[str, Any]:
        if isinstance(self.tree, FeatureUnsupported):
            # Nothing could hold its processes: end_workload could not end them.
            raise FeatureUnsupported(f"background processes on local: {self.tree}")
        argv, directory = self._placed(request.args, request.cwd)
        # The manager's own environment is the session's: a process started as itself
        # (no user switch) inherits it, the request's added.
        env = [f"{k}={v}" for k, v in request.env.items()]
        return {
            "argv": argv,
            "cwd": str(directory),
            "env": env,
            "user": request.user or "",
            "as_self": request.user is None,
        }

    async def _process_manager(self, service: str | None) -> ProcessManager:
        procs.manager_binary()  # FeatureUnsupported, naming why, where there is none
        return self.procs

    async def _exec(self, request: ExecRequest) -> ExecResult:
        args, directory = self._placed(request.args, request.cwd)
        return await run_process(
            args,
            cwd=str(directory),
            env={**self._env, **request.env},
            user=request.user,
            timeout=request.timeout,
            stdin=request.stdin,
            on_output=request.on_output,
            output_limit=request.output_limit,
            cgroup=self.tree if isinstance(self.tree, SessionCgroup) else None,
        )

    async def _end_workload(self) -> None:
        if isinstance(self.tree, FeatureUnsupported):
            raise FeatureUnsupported(str(self.tree))
        await self.tree.kill(self._end_workload_timeout_s)

    async def _apply_network_policy(self, policy: NetworkPolicy) -> None:
        if policy.network_mode is self.policy.network_mode:
            return
        processes = self.tree
        if isinstance(processes, FeatureUnsupported):
            raise NetworkPolicyUnsupported(
                f"the local provider cannot switch from {self.policy} to {policy}: it cannot "
                f"tell whether a process started under the old policy lives on ({processes})"
            )
        alive = processes.alive()
        if alive:
            raise NetworkPolicyUnsupported(
                f"the local provider cannot switch from {self.policy} to {policy} while "
                f"processes {', '.join(map(str, alive))} started under it live on (each "
                "keeps the network it was started with); end them first (end_workload)"
            )

    async def _save(self) -> SnapshotRef:
        """A copy of the workspace (the session's home); its scratch `.tmp` stays behind."""

        def copy(tree: Path) -> None:
            shutil.copytree(
                self.workspace,
                tree,
                symlinks=True,
                ignore=lambda directory, _names: (
                    [".tmp"] if directory == str(self.workspace) else []
                ),
            )

        async def fill(record: SnapshotRecord) -> None:
            await anyio.to_thread.run_sync(copy, self._shelf.tree(record.id, 0))

        return await self._shelf.write(self.id, (str(self.workspace),), fill)

    async def _upload(self, local: Path, remote: str, service: str | None) -> None:
        target = self._path(remote)

        def copy() -> None:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, target)

        await anyio.to_thread.run_sync(copy)

    async def _download(
        self, remote: str, local: Path, service: str | None, max_bytes: int | None
    ) -> None:
        source = self._path(remote, follow=False)

        def copy() -> None:
            with open_regular(source, remote) as src:
                # Measured on the descriptor that is read, and the copy held to it: the
                # file may grow while it is copied.
                size = os.fstat(src.fileno()).st_size
                file_limit(remote, size, max_bytes)
                Path(local).parent.mkdir(parents=True, exist_ok=True)
                with Path(local).open("wb") as out:
                    copy_at_most(src, out, size)

        await anyio.to_thread.run_sync(copy)

    def resolve_path(self, path: str) -> str:
        return str(self._path(path))

    async def remove(self, path: str) -> None:
        target = self._path(path, follow=False)
        if target == self.workspace:
            raise ConfigError(f"sandbox path {path!r} is the session's root; it stays")

        def remove() -> None:
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)

        await anyio.to_thread.run_sync(remove)

    async def write_text(self, path: str, text: str, *, service: str | None = None) -> None:
        self.service_name(service)
        target = self._path(path)
        await anyio.Path(target.parent).mkdir(parents=True, exist_ok=True)
        await anyio.Path(target).write_text(text, encoding="utf-8")

    async def read_text(
        self,
        path: str,
        *,
        service: str | None = None,
        max_bytes: int | None = READ_TEXT_LIMIT_BYTES,
    ) -> str:
        self.service_name(service)
        source = self._path(path, follow=False)

        def read() -> bytes:
            with open_regular(source, path) as src:
                size = os.fstat(src.fileno()).st_size
                file_limit(path, size, max_bytes)
                return src.read(size)

        data = await anyio.to_thread.run_sync(read)
        return data.decode("utf-8", errors="replace")

    async def _upload_dir(self, local_dir: Path, remote_dir: str, service: str | None) -> None:
        target = self._path(remote_dir)
        await anyio.to_thread.run_sync(lambda: extract_tar(pack_dir(local_dir), target))

    async def _download_dir(self, remote_dir: str, local_dir: Path, service: str | None) -> None:
        source = self._existing(remote_dir)
        if not source.is_dir():
            raise NotADirectoryError(f"sandbox path {remote_dir!r} is not a directory")
        await anyio.to_thread.run_sync(lambda: extract_tar(pack_dir(source), local_dir))

    async def endpoint(self, port: int) -> str | None:
        if self.policy.network_mode is NetworkMode.NO_NETWORK:
            return None  # each exec has its own namespace; nothing there is reachable
        return f"http://127.0.0.1:{port}"

    async def host_gateway(self) -> str | None:
        return None if self.policy.network_mode is NetworkMode.NO_NETWORK else "127.0.0.1"

    def _existing(self, remote: str) -> Path:
        path = self._path(remote)
        if not path.exists():
            raise RemotePathNotFound(remote)
        return path
