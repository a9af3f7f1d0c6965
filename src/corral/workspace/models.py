"""What a binding hands back: the bound workspace, its snapshot, an observed revision."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

BindingKind = Literal["sync", "git", "none"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BoundWorkspace(_Frozen):
    """One binding's workspace in one session, from `bind` until `finalize`/`abandon`."""

    binding: BindingKind
    session_id: str
    path: str | None = Field(description="where the workspace is in the sandbox, if anywhere")
    source: str | None = Field(description="the host directory or repository it came from")
    revision: str | None = Field(description="the source's revision at bind time")
    files: int = Field(default=0, description="entries copied into the sandbox")
    bytes: int = Field(default=0, description="bytes of the files copied into the sandbox")
    #: The binding's key for its own state of this bind; not part of the workspace's identity.
    state_key: str = Field(repr=False, exclude=True)


class GitState(_Frozen):
    """A repository's state as the harness computes it from the bound commit."""

    commit: str = Field(description="the commit the workspace was bound at")
    branch: str | None = Field(description="the branch checked out at bind time, if any")
    dirty: bool = Field(description="whether the workspace differs from `commit`")
    changed_paths: tuple[str, ...] = ()
    changed_paths_truncated: bool = False
    diff: str = Field(default="", description="a binary-safe patch from `commit`, bounded")
    diff_truncated: bool = False


class SyncReport(_Frozen):
    """What sync-back did to the host source."""

    synced_back: bool
    source_changed: bool = Field(
        default=False, description="whether the source moved since bind (a conflict)"
    )
    written: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    kept_source: tuple[str, ...] = Field(
        default=(), description="paths the source changed, kept over the sandbox's"
    )


class WorkspaceSnapshot(_Frozen):
    """The workspace version a finalize left behind."""

    snapshot_id: str = Field(description="a digest of the workspace's content")
    binding: BindingKind
    source: str | None = None
    outcome: str | None = None
    git: GitState | None = None
    sync: SyncReport | None = None


class WorkspaceRevision(_Frozen):
    """The bound workspace's state now, observed without changing it."""

    supported: bool
    revision: str | None = Field(default=None, description="a digest of the content now")
    changed_paths: tuple[str, ...] = Field(
        default=(), description="paths that differ from what was bound"
    )
    git: GitState | None = None
