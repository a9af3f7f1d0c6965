"""What corral raises reaches Inspect as Inspect's own sandboxes raise it."""

from __future__ import annotations

import pytest
from inspect_ai.util import SandboxUserUnsupportedError

from corral import ExecutionPlan
from corral.adapters.inspect import CorralSandboxEnvironment
from corral.network import NetworkSchedule
from corral.providers.local import LocalEnvironment

pytestmark = pytest.mark.anyio


async def test_a_user_the_host_does_not_have_is_inspects_user_unsupported_on_local() -> None:
    # Inspect's self-check (test_exec_as_nonexistent_user) takes this, as from its own
    # local sandbox; corral's ConfigError was an error of the eval.
    async with LocalEnvironment().session(ExecutionPlan()) as session:
        sandbox = CorralSandboxEnvironment(session, NetworkSchedule())
        with pytest.raises(SandboxUserUnsupportedError, match="'nonexistent' does not exist"):
            await sandbox.exec(["whoami"], user="nonexistent")
        assert (await sandbox.exec(["true"])).success
