"""Workspace bindings: what files the agent sees, and what comes back.

- `SyncBinding`: a host directory copied in at bind, the agent's changes synced back.
- `GitRepositoryBinding`: a repository cloned by the harness and checked out at a ref;
  finalize records the commit, branch, dirty state and the agent's patch.
- `NoWorkspaceBinding`: no workspace.

Each has `async bind(session, *, path=None) -> BoundWorkspace`,
`async finalize(bound, *, outcome=None) -> WorkspaceSnapshot | None`,
`async observe_revision(bound) -> WorkspaceRevision` and `abandon(bound) -> bool`;
`TaskRun(..., bindings=[...])` binds them before the run and finalizes them after
evaluation. Everything that comes back from a sandbox is untrusted: it is held to the
binding's limits while it streams and staged before anything on the host changes.
"""

from corral.core.treelimits import TreeLimits
from corral.errors import SyncBindingSourceConflictError, TransferLimitExceeded, WorkspaceBusy
from corral.workspace.git import GitOptions, GitRepositoryBinding
from corral.workspace.models import (
    BoundWorkspace,
    GitState,
    SyncReport,
    WorkspaceRevision,
    WorkspaceSnapshot,
)
from corral.workspace.none import NoWorkspaceBinding, NoWorkspaceOptions
from corral.workspace.options import BindingConfig, binding_from
from corral.workspace.sync import SyncBinding, SyncOptions

__all__ = [
    "BindingConfig",
    "BoundWorkspace",
    "GitOptions",
    "GitRepositoryBinding",
    "GitState",
    "NoWorkspaceBinding",
    "NoWorkspaceOptions",
    "SyncBinding",
    "SyncBindingSourceConflictError",
    "SyncOptions",
    "SyncReport",
    "TransferLimitExceeded",
    "TreeLimits",
    "WorkspaceBusy",
    "WorkspaceRevision",
    "WorkspaceSnapshot",
    "binding_from",
]
