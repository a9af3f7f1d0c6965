"""mini-swe-agent (`mini-swe-agent`) environment backed by a corral sandbox (extra
`minisweagent`): `environment_class: corral.adapters.minisweagent.CorralEnvironment` in a
mini-swe-agent config, or `CorralEnvironment(provider=..., plan=...)` in code.
"""

from corral.adapters.minisweagent.config import CorralEnvironmentConfig
from corral.adapters.minisweagent.environment import CorralEnvironment

__all__ = ["CorralEnvironment", "CorralEnvironmentConfig"]
