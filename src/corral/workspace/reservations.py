"""Which sources and sandbox paths live bindings hold, process-wide.

Two live bindings of one source would each sync back over the other's result, and two of
one sandbox path would each see the other's files as the agent's; so a path is held from
bind until finalize succeeds or the binding is abandoned, and a bind that overlaps one
held (the same path, or one inside the other) is refused.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass
from pathlib import PurePath, PurePosixPath

from corral.errors import WorkspaceBusy


@dataclass(frozen=True)
class Resource:
    """A host directory (`scope` empty) or a path in the sandbox of session `scope`."""

    scope: str
    path: PurePath

    def overlaps(self, other: Resource) -> bool:
        return self.scope == other.scope and (
            self.path.is_relative_to(other.path) or other.path.is_relative_to(self.path)
        )

    def __str__(self) -> str:
        return f"{self.path} in sandbox {self.scope}" if self.scope else str(self.path)


def host(path: PurePath) -> Resource:
    return Resource("", path)


def sandbox(session_id: str, path: str) -> Resource:
    return Resource(session_id, PurePosixPath(path))


_lock = threading.Lock()
_held: dict[str, tuple[Resource, ...]] = {}


def reserve(*resources: Resource) -> str:
    """Hold `resources` for one bind; returns the key that releases them."""
    with _lock:
        for key, held in _held.items():
            for mine in resources:
                clash = next((r for r in held if r.overlaps(mine)), None)
                if clash is not None:
                    raise WorkspaceBusy(
                        f"{mine} overlaps {clash}, held by a live binding ({key[:8]}); "
                        "finalize or abandon that binding first"
                    )
        key = secrets.token_hex(16)
        _held[key] = resources
        return key


def release(key: str) -> bool:
    """Release what `key` holds; False when it held nothing (already released)."""
    with _lock:
        return _held.pop(key, None) is not None
