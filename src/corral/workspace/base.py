"""What every binding shares: options as a frozen model, and per-bind state by key."""

from __future__ import annotations

import posixpath
import threading
from typing import Any, ClassVar, Generic, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field

from corral.core.session import EnvironmentSession
from corral.core.treelimits import DEFAULT_LIMITS, TreeLimits
from corral.errors import ConfigError
from corral.workspace import reservations
from corral.workspace.models import BoundWorkspace, WorkspaceRevision

Opts = TypeVar("Opts", bound="BindingOptions")
S = TypeVar("S")


class BindingOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PlacedOptions(BindingOptions):
    """Options of a binding that puts a workspace at a path in the sandbox."""

    path: str | None = Field(
        default=None, description="absolute sandbox path of the workspace (or bind(path=...))"
    )

    def sandbox_path(self, override: str | None) -> str:
        path = override if override is not None else self.path
        if path is None:
            raise ConfigError(
                f"{type(self).__name__} needs a sandbox path: path=... or bind(session, path=...)"
            )
        if not path.startswith("/") or "\0" in path:
            raise ConfigError(f"sandbox path {path!r} must be absolute")
        normal = posixpath.normpath(path)
        if normal in ("/", "//"):
            raise ConfigError(f"sandbox path {path!r} is the sandbox's root; name a directory")
        return normal


class LimitedOptions(PlacedOptions):
    """Bounds on what one transfer in either direction may carry (None: no bound)."""

    max_files: int | None = Field(
        default=DEFAULT_LIMITS.max_files, ge=1, description="entries in the tree"
    )
    max_file_bytes: int | None = Field(
        default=DEFAULT_LIMITS.max_file_bytes, ge=0, description="bytes of one file"
    )
    max_total_bytes: int | None = Field(
        default=DEFAULT_LIMITS.max_total_bytes, ge=0, description="bytes of all files"
    )
    max_archive_bytes: int | None = Field(
        default=DEFAULT_LIMITS.max_archive_bytes, ge=0, description="raw bytes of a tar stream"
    )

    def limits(self) -> TreeLimits:
        return TreeLimits(
            max_files=self.max_files,
            max_file_bytes=self.max_file_bytes,
            max_total_bytes=self.max_total_bytes,
            max_archive_bytes=self.max_archive_bytes,
        )


class Binding(Generic[Opts, S]):
    """A binding's options, and the state of each live bind, keyed by its reservation."""

    kind: ClassVar[str]
    options_model: ClassVar[type[BindingOptions]]

    def __init__(self, options: Opts | None = None, **fields: Any) -> None:
        if options is not None and fields:
            raise ConfigError(f"{type(self).__name__} takes options or fields, not both")
        if options is not None and not isinstance(options, self.options_model):
            raise ConfigError(
                f"{type(self).__name__}({options!r}): give the fields by name "
                f"({', '.join(self.options_model.model_fields)}), or a "
                f"{self.options_model.__name__}"
            )
        if options is None:
            options = cast(Opts, self.options_model.model_validate(fields))
        self.options: Opts = options
        self._states: dict[str, tuple[EnvironmentSession, S]] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.options!r})"

    def _adopt(self, key: str, session: EnvironmentSession, state: S) -> None:
        with self._lock:
            self._states[key] = (session, state)

    def _state(self, bound: BoundWorkspace) -> tuple[EnvironmentSession, S]:
        with self._lock:
            found = self._states.get(bound.state_key)
        if found is None or bound.binding != self.kind:
            raise ConfigError(
                f"workspace {bound.path!r} of session {bound.session_id} is not live in this "
                f"{type(self).__name__}: bound by another, or already finalized or abandoned"
            )
        return found

    def _release(self, bound: BoundWorkspace) -> bool:
        """Release a bind this binding owns (another's is left alone); False if none."""
        with self._lock:
            found = self._states.pop(bound.state_key, None)
        if found is None:
            return False
        reservations.release(bound.state_key)
        self._discard(found[1])
        return True

    def _discard(self, state: S) -> None:
        """Free what a bind's state holds on the host (temporary clones)."""

    def abandon(self, bound: BoundWorkspace) -> bool:
        """Release a bind whose finalize will not run: its reservation and its state.
        Nothing is synced back. False when this binding holds no such bind (another
        binding's, or already released)."""
        return self._release(bound)

    async def observe_revision(self, bound: BoundWorkspace) -> WorkspaceRevision:
        """The workspace's state now, without changing it (unsupported by default)."""
        return WorkspaceRevision(supported=False)
