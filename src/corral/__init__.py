"""corral: sandbox environment providers for agent harnesses.

`import corral` needs neither the Docker nor the Kubernetes SDK; each provider
imports its SDK only when it is used.
"""

from corral.core.environment import ENVIRONMENTS, BaseEnvironment
from corral.core.lifecycle import TaskRun
from corral.core.plan import ExecutionPlan, Healthcheck, Recipe, Resources, ServiceSpec, Timeouts
from corral.core.processes import (
    Process,
    ProcessExited,
    ProcessInfo,
    ProcessOutput,
    PtySize,
)
from corral.core.session import EnvironmentSession, ExecResult
from corral.core.shell import Shell
from corral.core.snapshot import EnvironmentFeatures, SnapshotRef
from corral.errors import (
    AdmissionTimeout,
    ConfigError,
    CorralError,
    ExecUserUnsupported,
    FeatureUnsupported,
    NetworkPolicyNotEnforced,
    NetworkPolicyUnsupported,
    ProcessNotFound,
    ProviderError,
    RemotePathNotFound,
    SessionIdTaken,
    SessionNotFound,
    StartupTimeout,
    SyncBindingSourceConflictError,
    TransferLimitExceeded,
    UnsafeArchiveMember,
    WorkloadNotStopped,
    WorkspaceBusy,
)
from corral.network import NetworkMode, NetworkPolicy, NetworkSchedule
from corral.providers.configs import ProviderConfig, environment_for, provider_config
from corral.signals import cancelled_on_signals

__all__ = [
    "ENVIRONMENTS",
    "AdmissionTimeout",
    "BaseEnvironment",
    "ConfigError",
    "CorralError",
    "EnvironmentFeatures",
    "EnvironmentSession",
    "ExecResult",
    "ExecUserUnsupported",
    "ExecutionPlan",
    "FeatureUnsupported",
    "Healthcheck",
    "NetworkMode",
    "NetworkPolicy",
    "NetworkPolicyNotEnforced",
    "NetworkPolicyUnsupported",
    "NetworkSchedule",
    "Process",
    "ProcessExited",
    "ProcessInfo",
    "ProcessNotFound",
    "ProcessOutput",
    "ProviderConfig",
    "ProviderError",
    "PtySize",
    "Recipe",
    "RemotePathNotFound",
    "Resources",
    "ServiceSpec",
    "SessionIdTaken",
    "SessionNotFound",
    "Shell",
    "SnapshotRef",
    "StartupTimeout",
    "SyncBindingSourceConflictError",
    "TaskRun",
    "Timeouts",
    "TransferLimitExceeded",
    "UnsafeArchiveMember",
    "WorkloadNotStopped",
    "WorkspaceBusy",
    "cancelled_on_signals",
    "environment_for",
    "provider_config",
]
