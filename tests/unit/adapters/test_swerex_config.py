"""The SWE-ReX deployment's config and what needs no sandbox: SWE-ReX's `get_deployment`
builds it, it round-trips through JSON, a deployment not started says so, and commands
map onto argv as `subprocess.run` would run them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from swerex.deployment import get_deployment
from swerex.exceptions import DeploymentNotStartedError
from swerex.runtime.abstract import Command

from corral import ExecutionPlan
from corral.adapters.swerex import CorralDeployment, CorralDeploymentConfig
from corral.adapters.swerex.runtime import subprocess_argv
from corral.providers.local import LocalConfig, LocalEnvironment


def test_get_deployment_builds_a_corral_deployment() -> None:
    config = CorralDeploymentConfig(provider="local", plan=ExecutionPlan(workdir="/work"))
    deployment = get_deployment(config)  # pyright: ignore[reportArgumentType]  # SWE-ReX's union names only its own
    assert isinstance(deployment, CorralDeployment)
    assert isinstance(config.get_deployment(), CorralDeployment)


def test_the_config_round_trips_and_refuses_unknown_keys() -> None:
    config = CorralDeploymentConfig(
        provider="docker",
        provider_config={"holder_image": "h"},
        plan=ExecutionPlan(image="python:3.11"),
    )
    assert config.type == "corral"
    assert CorralDeploymentConfig.model_validate_json(config.model_dump_json()) == config
    assert config.provider_params() == {"owner": "swerex", "holder_image": "h"}
    assert (
        CorralDeploymentConfig(provider_config={"owner": "me"}).provider_params()["owner"] == "me"
    )
    with pytest.raises(ValidationError):
        CorralDeploymentConfig.model_validate({"image": "python:3.11"})
    with pytest.raises(ValidationError):
        CorralDeploymentConfig.model_validate({"type": "docker"})


@pytest.mark.anyio
async def test_a_deployment_not_started_says_so() -> None:
    deployment = CorralDeployment(provider="local")
    with pytest.raises(DeploymentNotStartedError):
        await deployment.is_alive()
    with pytest.raises(DeploymentNotStartedError):
        _ = deployment.runtime
    await deployment.stop()


@pytest.mark.parametrize(
    ("command", "shell", "args"),
    [
        (["echo", "a b"], False, ["echo", "a b"]),
        ("ls", False, ["ls"]),
        ("echo $HOME", True, ["/bin/sh", "-c", "echo $HOME"]),
        (["echo $0", "zero"], True, ["/bin/sh", "-c", "echo $0", "zero"]),
    ],
)
def test_commands_run_as_subprocess_would_run_them(
    command: str | list[str], shell: bool, args: list[str]
) -> None:
    assert subprocess_argv(Command(command=command, shell=shell)) == args


def test_a_typed_provider_config_is_taken_whole_with_the_adapters_owner_under_it() -> None:
    typed = CorralDeploymentConfig(config=LocalConfig(), plan=ExecutionPlan())
    environment = typed.environment()
    assert isinstance(environment, LocalEnvironment)
    assert environment.config.owner == "swerex", "the adapter's owner, as for provider_config"
    mine = CorralDeploymentConfig(config=LocalConfig(owner="me")).environment()
    assert mine.config.owner == "me"
    from_json = CorralDeploymentConfig.model_validate({"config": {"type": "local"}})
    assert isinstance(from_json.config, LocalConfig)
    with pytest.raises(ValidationError, match="'local' config.*not both"):
        CorralDeploymentConfig(provider="docker", config=LocalConfig())
    with pytest.raises(ValidationError, match="nosuch"):
        CorralDeploymentConfig.model_validate({"config": {"type": "nosuch"}})
