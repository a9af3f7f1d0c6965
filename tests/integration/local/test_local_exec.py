"""`exec` on the embedded `local` provider: what the contract says of bad input."""

from __future__ import annotations

import pytest

from corral import ConfigError, ExecutionPlan
from corral.providers.local import LocalEnvironment

pytestmark = pytest.mark.anyio


async def test_an_unknown_user_is_a_config_error_naming_it() -> None:
    async with LocalEnvironment().session(ExecutionPlan()) as session:
        with pytest.raises(ConfigError, match="exec user 'no-such-user-corral' does not exist"):
            await session.exec(["true"], user="no-such-user-corral")
        assert (await session.exec(["true"])).returncode == 0, "the session still works"
