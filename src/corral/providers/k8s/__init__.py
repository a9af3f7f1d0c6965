"""The `k8s` provider: Pods on a Kubernetes cluster, egress by verified NetworkPolicy."""

from corral.providers.k8s.config import KubernetesConfig
from corral.providers.k8s.environment import KubernetesEnvironment

__all__ = ["KubernetesConfig", "KubernetesEnvironment"]
