"""Bindings as data: one discriminated union of their options, for configs in JSON."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from corral.workspace.git import GitOptions, GitRepositoryBinding
from corral.workspace.none import NoWorkspaceBinding, NoWorkspaceOptions
from corral.workspace.sync import SyncBinding, SyncOptions

BindingConfig = Annotated[
    SyncOptions | GitOptions | NoWorkspaceOptions, Field(discriminator="kind")
]


def binding_from(
    options: SyncOptions | GitOptions | NoWorkspaceOptions,
) -> SyncBinding | GitRepositoryBinding | NoWorkspaceBinding:
    """The binding these options configure (a fresh one: its live state is its own)."""
    if isinstance(options, SyncOptions):
        return SyncBinding(options)
    if isinstance(options, GitOptions):
        return GitRepositoryBinding(options)
    return NoWorkspaceBinding(options)
