"""What a provider can do beyond the network, and the reference a saved sandbox leaves."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict


class EnvironmentFeatures(BaseModel):
    """A provider's answers to "can it do this?"; a call it cannot serve raises
    `FeatureUnsupported` naming the feature."""

    model_config = ConfigDict(frozen=True)

    provider: str
    supports_reattach: bool
    supports_snapshot: bool
    supports_services: bool
    supports_network_events: bool
    #: `session.start` and `session.shell` (background processes, stdin, signals)
    supports_processes: bool = False
    #: `session.start(..., pty=PtySize(...))`
    supports_pty: bool = False
    #: `plan.credentials`: keys the sandbox uses through corral's proxy, never holds
    supports_credentials: bool = False


class SnapshotRef(BaseModel):
    """A saved sandbox state, kept by its provider until `expires_at` (then `gc` takes it).

    It names the state; it never carries the parent's policy, processes or secrets."""

    model_config = ConfigDict(frozen=True)

    provider: str
    id: str
    created_at: datetime
    source_session: str
    expires_at: datetime
