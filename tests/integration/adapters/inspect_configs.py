"""The corral sandboxes Inspect's own suite runs against, with the failures Inspect expects."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from corral import ExecutionPlan
from corral.adapters.inspect import CorralSandboxConfig
from tests.integration.docker.conftest import HOLDER_IMAGE, TEST_IMAGE
from tests.integration.k8s.conftest import TEST_IMAGE as K8S_TEST_IMAGE
from tests.integration.k8s.conftest import kubeconfig

ROOT_OVERWRITES = "root can overwrite a read-only file (Inspect expects this of docker-root too)"


@dataclass(frozen=True)
class SuiteTarget:
    id: str
    provider: str
    provider_config: dict[str, Any]
    plan: ExecutionPlan
    xfails: dict[str, str] = field(default_factory=dict[str, str])

    def config(self, owner: str) -> CorralSandboxConfig:
        return CorralSandboxConfig(
            provider=self.provider,
            provider_config={**self.provider_config, "owner": owner},
            plan=self.plan,
        )


DOCKER = {"holder_image": HOLDER_IMAGE, "pull_policy": "never"}

DOCKER_ROOT = SuiteTarget(
    id="docker-root",
    provider="docker",
    provider_config=DOCKER,
    plan=ExecutionPlan(image=TEST_IMAGE),
    xfails={
        "test_write_text_file_without_permissions": ROOT_OVERWRITES,
        "test_write_binary_file_without_permissions": ROOT_OVERWRITES,
    },
)

DOCKER_NONROOT = SuiteTarget(
    id="docker-nonroot",
    provider="docker",
    provider_config={**DOCKER, "user": "corral"},
    plan=ExecutionPlan(image=TEST_IMAGE, workdir="/home/corral"),
)

K8S_ROOT = SuiteTarget(
    id="k8s-root",
    provider="k8s",
    provider_config={
        "kubeconfig": kubeconfig(),
        "namespace": "corral-inspect",
        "create_namespace": True,
        "image_pull_policy": "Never",
    },
    plan=ExecutionPlan(image=K8S_TEST_IMAGE),
    xfails={
        "test_write_text_file_without_permissions": ROOT_OVERWRITES,
        "test_write_binary_file_without_permissions": ROOT_OVERWRITES,
        "test_exec_as_user": "the Kubernetes exec API cannot switch users; corral raises "
        "ExecUserUnsupported, which the adapter maps to SandboxUserUnsupportedError",
    },
)
