from __future__ import annotations

import pytest

from corral.core.session import ExecRequest, ExecResult
from corral.demo import _connects  # pyright: ignore[reportPrivateUsage]
from corral.network.policy import NetworkPolicy
from tests.unit.fakes import FakeEnvironment, FakeSession

pytestmark = pytest.mark.anyio


class NoDialer(FakeSession):
    async def _exec(self, request: ExecRequest) -> ExecResult:
        return ExecResult(returncode=127, stdout="", stderr="nc: not found", duration_s=0.0)


async def test_a_probe_that_cannot_run_is_never_read_as_refused() -> None:
    env = FakeEnvironment()
    session = NoDialer(env, NetworkPolicy.no_network())
    assert await _connects(session, env, "127.0.0.1", 9) is None
