"""`NoWorkspaceBinding`: the agent works without a workspace; nothing goes in or comes back."""

from __future__ import annotations

from typing import ClassVar, Literal

from corral.core.session import EnvironmentSession
from corral.workspace.base import Binding, BindingOptions
from corral.workspace.models import BoundWorkspace


class NoWorkspaceOptions(BindingOptions):
    kind: Literal["none"] = "none"


class NoWorkspaceBinding(Binding[NoWorkspaceOptions, None]):
    kind: ClassVar[str] = "none"
    options_model = NoWorkspaceOptions

    async def bind(self, session: EnvironmentSession, *, path: str | None = None) -> BoundWorkspace:
        return BoundWorkspace(
            binding="none",
            session_id=session.id,
            path=None,
            source=None,
            revision=None,
            state_key="",
        )

    async def finalize(self, bound: BoundWorkspace, *, outcome: str | None = None) -> None:
        return None

    def abandon(self, bound: BoundWorkspace) -> bool:
        return True
