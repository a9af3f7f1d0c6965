"""The `k8s` provider: Pods on a Kubernetes cluster, egress by verified NetworkPolicy."""

from typing import TYPE_CHECKING, Any

from corral.providers.k8s.config import KubernetesConfig

if TYPE_CHECKING:
    from corral.providers.k8s.environment import KubernetesEnvironment

__all__ = ["KubernetesConfig", "KubernetesEnvironment"]


def __getattr__(name: str) -> Any:
    # The environment (and its SDK) is imported on first use: the config alone is light.
    if name == "KubernetesEnvironment":
        from corral.providers.k8s.environment import KubernetesEnvironment

        return KubernetesEnvironment
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
