"""The Inspect sandbox's config: a typed provider config gets the same defaults as
`provider_config` (the owner, Inspect's output limit), each unless the config sets it."""

from __future__ import annotations

from inspect_ai.util import SandboxEnvironmentLimits

from corral import ExecutionPlan
from corral.adapters.inspect.config import CorralSandboxConfig
from corral.providers.local import LocalConfig, LocalEnvironment


def test_a_typed_config_gets_inspects_owner_and_output_limit_unless_it_sets_them() -> None:
    limit = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
    typed = CorralSandboxConfig(config=LocalConfig(), plan=ExecutionPlan()).environment()
    by_id = CorralSandboxConfig(provider="local", plan=ExecutionPlan()).environment()
    assert isinstance(typed, LocalEnvironment) and isinstance(by_id, LocalEnvironment)
    assert (typed.config.owner, typed.config.output_limit_bytes) == ("inspect", limit)
    assert (by_id.config.owner, by_id.config.output_limit_bytes) == ("inspect", limit)
    own = LocalConfig(owner="me", output_limit_bytes=4096)
    mine = CorralSandboxConfig(config=own, plan=ExecutionPlan()).environment()
    assert isinstance(mine, LocalEnvironment)
    assert (mine.config.owner, mine.config.output_limit_bytes) == ("me", 4096)
