from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral import ENVIRONMENTS, ExecutionPlan
from corral.providers.local.session import LocalSession


@pytest.fixture
async def local() -> AsyncIterator[LocalSession]:
    """A `local` sandbox: paths inside its root are host paths, so tests can act as the host."""
    async with ENVIRONMENTS.create("local").session(ExecutionPlan()) as session:
        assert isinstance(session, LocalSession)
        yield session


@pytest.fixture
def ws(local: LocalSession) -> str:
    """The sandbox path bindings bind to."""
    return str(Path(local.workdir) / "ws")
