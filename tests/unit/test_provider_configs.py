"""The providers' configs as one typed family (issue 24, item 8): `type` tells them apart,
`environment_for` builds the provider it names, and a config imports no SDK."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import BaseModel

from corral import ENVIRONMENTS, ConfigError, ProviderConfig, environment_for, provider_config
from corral.providers.docker import DockerConfig
from corral.providers.k8s import KubernetesConfig
from corral.providers.local import LocalConfig, LocalEnvironment


@pytest.mark.parametrize("config", [DockerConfig, KubernetesConfig, LocalConfig])
def test_each_type_is_its_providers_id(
    config: type[DockerConfig | KubernetesConfig | LocalConfig],
) -> None:
    kind = config().type
    assert ENVIRONMENTS.get(kind).config_model is config


def test_a_config_is_chosen_by_its_type() -> None:
    chosen = provider_config({"type": "k8s", "namespace": "work"})
    assert isinstance(chosen, KubernetesConfig) and chosen.namespace == "work"

    class Harness(BaseModel):
        provider: ProviderConfig

    embedded = Harness.model_validate({"provider": {"type": "docker", "default_memory_mb": 256}})
    assert isinstance(embedded.provider, DockerConfig)
    assert embedded.provider.default_memory_mb == 256


def test_environment_for_builds_the_provider_the_config_names() -> None:
    env = environment_for(provider_config({"type": "local"}))
    assert isinstance(env, LocalEnvironment)


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"type": "nope"}, "'nope' is none of: docker, k8s, local"),
        ({}, "None is none of"),
        ({"type": "docker", "bogus": 1}, "bogus"),
        ({"type": "local", "namespace": "x"}, "namespace"),
    ],
)
def test_a_bad_config_is_refused_naming_what_is_wrong(data: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        provider_config(data)


def test_a_config_does_not_match_another_providers_type() -> None:
    with pytest.raises(ConfigError, match="kubeconfig"):
        provider_config({"type": "docker", "kubeconfig": "x"})
    with pytest.raises(ValueError, match="docker"):
        DockerConfig.model_validate({"type": "k8s"})


def test_importing_the_configs_imports_no_sdk() -> None:
    code = (
        "import sys, corral\n"
        "from corral.providers.docker import DockerConfig\n"
        "from corral.providers.k8s import KubernetesConfig\n"
        "print(sorted(m for m in ('docker', 'kubernetes') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
