"""corral: sandbox environment providers for agent harnesses.

`import corral` needs neither the Docker nor the Kubernetes SDK; each provider
imports its SDK only when it is used.
"""

from corral.core.environment import ENVIRONMENTS, BaseEnvironment
from corral.core.lifecycle import TaskRun
from corral.core.plan import ExecutionPlan, Recipe, Resources, Timeouts
from corral.core.session import EnvironmentSession, ExecResult
from corral.errors import (
    ConfigError,
    CorralError,
    NetworkPolicyNotEnforced,
    NetworkPolicyUnsupported,
    ProviderError,
    RemotePathNotFound,
    StartupTimeout,
    UnsafeArchiveMember,
)
from corral.network import NetworkMode, NetworkPolicy, NetworkSchedule

__all__ = [
    "ENVIRONMENTS",
    "BaseEnvironment",
    "ConfigError",
    "CorralError",
    "EnvironmentSession",
    "ExecResult",
    "ExecutionPlan",
    "NetworkMode",
    "NetworkPolicy",
    "NetworkPolicyNotEnforced",
    "NetworkPolicyUnsupported",
    "NetworkSchedule",
    "ProviderError",
    "Recipe",
    "RemotePathNotFound",
    "Resources",
    "StartupTimeout",
    "TaskRun",
    "Timeouts",
    "UnsafeArchiveMember",
]
