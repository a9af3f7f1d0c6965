"""The `k8s` provider: Pods on a Kubernetes cluster, egress by verified NetworkPolicy."""

from typing import TYPE_CHECKING

from corral.core.lazy import lazy_names
from corral.providers.k8s.config import KubernetesConfig

if TYPE_CHECKING:
    from corral.providers.k8s.environment import KubernetesEnvironment

__all__ = ["KubernetesConfig", "KubernetesEnvironment"]


__getattr__ = lazy_names(__name__, KubernetesEnvironment="corral.providers.k8s.environment")
