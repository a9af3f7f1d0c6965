"""SWE-ReX (`swe-rex`) deployment and runtime backed by a corral sandbox (extra `swerex`).

`CorralDeploymentConfig(...).get_deployment()` (or `swerex.deployment.get_deployment`
on it) gives a `CorralDeployment`, whose runtime's bash sessions are corral shells,
commands corral execs and file calls corral's own.
"""

from corral.adapters.swerex.config import CorralDeploymentConfig
from corral.adapters.swerex.deployment import CorralDeployment
from corral.adapters.swerex.runtime import CorralRuntime

__all__ = ["CorralDeployment", "CorralDeploymentConfig", "CorralRuntime"]
