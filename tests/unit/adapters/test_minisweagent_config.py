"""The mini-swe-agent environment's config: mini-swe-agent's Docker environment keys,
corral's provider and plan, nothing else."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from corral.adapters.commands import merged
from corral.adapters.minisweagent import CorralEnvironmentConfig


def test_the_config_takes_mini_swe_agents_keys() -> None:
    config = CorralEnvironmentConfig.model_validate(
        {
            "provider": "docker",
            "plan": {"image": "python:3.11", "workdir": "/testbed"},
            "cwd": "/testbed",
            "env": {"PAGER": "cat"},
            "forward_env": ["GITHUB_TOKEN"],
            "timeout": 60,
        }
    )
    assert config.interpreter == ["bash", "-lc"]
    assert config.provider_params() == {"owner": "minisweagent"}
    with pytest.raises(ValidationError):
        CorralEnvironmentConfig.model_validate({"container_timeout": "2h"})
    with pytest.raises(ValidationError):
        CorralEnvironmentConfig(timeout=0)


def test_image_is_the_plans_image_as_mini_swe_agents_docker_key() -> None:
    # What mini-swe-agent's SWE-bench runner sets per instance (`env_config["image"]`).
    image = "docker.io/swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    config = CorralEnvironmentConfig.model_validate(
        {"image": image, "plan": {"image": "python:3.11", "workdir": "/testbed"}}
    )
    assert config.plan.image == image
    assert config.plan.workdir == "/testbed"
    assert CorralEnvironmentConfig(image="python:3.12").plan.image == "python:3.12"
    assert CorralEnvironmentConfig().plan.image is None
    with pytest.raises(ValidationError, match="image"):
        CorralEnvironmentConfig(image="")


def test_merged_runs_the_command_itself_with_stderr_on_stdout() -> None:
    assert merged(["bash", "-lc", "ls"]) == [
        "/bin/sh",
        "-c",
        'exec 2>&1; exec "$@"',
        "sh",
        "bash",
        "-lc",
        "ls",
    ]
