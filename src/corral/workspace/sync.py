"""`SyncBinding`: a host directory copied into the sandbox, and its changes copied back."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import anyio
from pydantic import Field, field_validator

from corral.core.session import EnvironmentSession
from corral.core.tarsafe import validate_dir
from corral.errors import ConfigError
from corral.workspace import reservations
from corral.workspace.apply import ConflictPolicy, apply, decide
from corral.workspace.base import Binding, LimitedOptions
from corral.workspace.manifest import Manifest, scan
from corral.workspace.models import (
    BoundWorkspace,
    SyncReport,
    WorkspaceRevision,
    WorkspaceSnapshot,
)
from corral.workspace.patterns import compile_pattern
from corral.workspace.retrieve import remove_tree, retrieved

SUCCESS = frozenset({None, "completed"})


class SyncOptions(LimitedOptions):
    kind: Literal["sync"] = "sync"
    source: Path = Field(description="the host directory to copy in and sync back to")
    pattern: str = Field(default="**/*", description="which paths (relative glob) are synced")
    clean_target: Literal["always", "never"] = Field(
        default="always", description="empty the sandbox path before copying in"
    )
    delete_missing: bool = Field(
        default=True, description="delete from the source what the agent deleted"
    )
    sync_back: Literal["always", "on_success", "never"] = Field(
        default="always",
        description="when finalize copies changes back (on_success: outcome 'completed')",
    )
    source_conflict_policy: ConflictPolicy = Field(
        default="overwrite",
        description="when the source changed since bind: the agent's changes win (overwrite), "
        "nothing is applied (fail), or the source's changed paths win (keep_source)",
    )

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, value: str) -> str:
        compile_pattern(value)
        return value


@dataclass(frozen=True)
class _Bind:
    source: Path
    path: str
    manifest: Manifest


class SyncBinding(Binding[SyncOptions, _Bind]):
    """Copy `source` into the sandbox at bind, one tar stream; at finalize, bring the
    sandbox's tree back (one tar stream, held to the limits while it streams, staged beside
    the source) and apply what the agent changed, by `source_conflict_policy`.

    The source and the sandbox path are held from bind until finalize succeeds or
    `abandon`: a second live bind of either (or of a path inside one) is refused.
    """

    kind: ClassVar[str] = "sync"
    options_model = SyncOptions

    async def bind(self, session: EnvironmentSession, *, path: str | None = None) -> BoundWorkspace:
        options = self.options
        target = options.sandbox_path(path)
        source = await anyio.to_thread.run_sync(lambda: options.source.resolve(strict=True))
        if not source.is_dir():
            raise ConfigError(f"sync source {str(source)!r} is not a directory")
        key = reservations.reserve(
            reservations.host(source), reservations.sandbox(session.id, target)
        )
        try:
            manifest = await self._copy_in(session, source, target)
        except BaseException:
            reservations.release(key)
            raise
        self._adopt(key, session, _Bind(source, target, manifest))
        return BoundWorkspace(
            binding="sync",
            session_id=session.id,
            path=target,
            source=str(source),
            revision=manifest.digest(),
            files=manifest.files,
            bytes=manifest.bytes,
            state_key=key,
        )

    async def _copy_in(self, session: EnvironmentSession, source: Path, target: str) -> Manifest:
        options = self.options
        holder = Path(await anyio.to_thread.run_sync(lambda: tempfile.mkdtemp(prefix="corral-ws-")))
        try:
            staged = holder / "tree"
            staged.mkdir()

            def stage() -> Manifest:
                # What is hashed is what was copied: the revision is what the sandbox got.
                manifest = scan(source, options.pattern, limits=options.limits(), copy_to=staged)
                validate_dir(staged)  # a link the upload would refuse: before the target is emptied
                return manifest

            manifest = await anyio.to_thread.run_sync(stage)
            if options.clean_target == "always":
                await session.remove(target)  # the image's files there: only what is bound stays
            await session.upload_dir(staged, target)
            return manifest
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(remove_tree, holder)

    async def finalize(
        self, bound: BoundWorkspace, *, outcome: str | None = None
    ) -> WorkspaceSnapshot:
        """Sync back per `sync_back`, then release the binding. A refusal (limits, an
        unsafe archive, a conflict under `fail`) writes nothing and keeps the binding
        held, so finalize can be tried again, or the binding abandoned."""
        session, state = self._state(bound)
        options = self.options
        wanted = options.sync_back == "always" or (
            options.sync_back == "on_success" and outcome in SUCCESS
        )
        report = SyncReport(synced_back=False)
        snapshot_id = bound.revision or ""
        if wanted:
            async with retrieved(
                session, state.path, options.limits(), beside=state.source
            ) as tree:

                def sync_back() -> tuple[str, SyncReport]:
                    returned = scan(tree, options.pattern)
                    changes = decide(
                        state.manifest,
                        returned,
                        scan(state.source, options.pattern),
                        source=state.source,
                        policy=options.source_conflict_policy,
                        delete_missing=options.delete_missing,
                    )
                    written, deleted = apply(state.source, tree, returned, changes)
                    return returned.digest(), SyncReport(
                        synced_back=True,
                        source_changed=changes.source_changed,
                        written=tuple(written),
                        deleted=tuple(deleted),
                        kept_source=changes.kept,
                    )

                snapshot_id, report = await anyio.to_thread.run_sync(sync_back)
        self._release(bound)
        return WorkspaceSnapshot(
            snapshot_id=snapshot_id,
            binding="sync",
            source=str(state.source),
            outcome=outcome,
            sync=report,
        )

    async def observe_revision(self, bound: BoundWorkspace) -> WorkspaceRevision:
        """The sandbox's tree now (brought back under the limits, never applied)."""
        session, state = self._state(bound)
        options = self.options
        async with retrieved(session, state.path, options.limits()) as tree:
            returned = await anyio.to_thread.run_sync(lambda: scan(tree, options.pattern))
        changed = state.manifest.differing(returned)
        return WorkspaceRevision(
            supported=True, revision=returned.digest(), changed_paths=tuple(changed)
        )
