"""What `TaskRun` needs of a workspace binding, and the bound workspaces of one session.

`corral.workspace` implements bindings; core knows them only through this protocol, so
the contract does not depend on how a workspace reaches the sandbox or comes back.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

import anyio

from corral.core.logs import event
from corral.core.session import EnvironmentSession

log = logging.getLogger("corral.bindings")


class WorkspaceBinding(Protocol):
    async def bind(self, session: EnvironmentSession, *, path: str | None = None) -> Any:
        """Make the workspace visible in `session`; returns the bound workspace."""
        ...

    async def finalize(self, bound: Any, *, outcome: str | None = None) -> Any:
        """Bring back (or drop) what the session did; returns a snapshot or None."""
        ...

    def abandon(self, bound: Any) -> bool:
        """Release a binding whose finalize will not run (again)."""
        ...


class BoundSet:
    """Bindings bound, in order, to one session; finalized or abandoned all together."""

    def __init__(self, bindings: Sequence[WorkspaceBinding]) -> None:
        self.bindings = tuple(bindings)
        self.bound: list[tuple[WorkspaceBinding, Any]] = []

    async def bind(self, session: EnvironmentSession) -> None:
        """Bind each; when one fails, release those already bound, then raise."""
        try:
            for binding in self.bindings:
                self.bound.append((binding, await binding.bind(session)))
        except BaseException:
            self.abandon()
            raise

    async def finalize(self, outcome: str) -> list[Any]:
        """Finalize each (every one is tried); the first failure is raised, the others
        attached to it as notes, and a binding that failed is abandoned."""
        snapshots: list[Any] = []
        failures: list[Exception] = []
        while self.bound:
            binding, bound = self.bound[0]
            try:
                snapshots.append(await binding.finalize(bound, outcome=outcome))
            except anyio.get_cancelled_exc_class():
                self.abandon()
                raise
            except Exception as failure:
                binding.abandon(bound)
                snapshots.append(None)
                failures.append(failure)
                event(log, "error", "finalizing a workspace failed", error=repr(failure))
            del self.bound[0]
        if failures:
            first, *rest = failures
            for other in rest:
                first.add_note(f"corral: finalizing another workspace also failed: {other!r}")
            raise first
        return snapshots

    def abandon(self) -> None:
        pending, self.bound = self.bound, []
        for binding, bound in pending:
            binding.abandon(bound)
