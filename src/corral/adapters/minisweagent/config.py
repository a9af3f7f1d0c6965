"""The corral environment's config: which provider and plan, and how each command runs.

The command fields keep the names of mini-swe-agent's own `DockerEnvironmentConfig`
(`cwd`, `env`, `forward_env`, `timeout`, `interpreter`), so a mini-swe-agent config
written for its Docker environment reads the same here."""

from __future__ import annotations

from typing import ClassVar, Self

from pydantic import ConfigDict, Field, model_validator

from corral.adapters.provider import ProviderChoice
from corral.core.plan import ExecutionPlan, ImageName

#: The corral.owner label of every sandbox a mini-swe-agent environment opens, unless the
#: config sets one (`corral gc --env ID -p owner=minisweagent` collects what a run left).
DEFAULT_OWNER = "minisweagent"


class CorralEnvironmentConfig(ProviderChoice):
    """`environment_class: corral.adapters.minisweagent.CorralEnvironment` and these keys."""

    model_config = ConfigDict(extra="forbid")

    default_owner: ClassVar[str] = DEFAULT_OWNER

    plan: ExecutionPlan = Field(
        default_factory=ExecutionPlan,
        description="image, workdir, env, resources and network schedule of the sandbox",
    )
    image: ImageName | None = Field(
        default=None,
        description="the sandbox's image, as mini-swe-agent's Docker environment takes it "
        "(a SWE-bench instance's own); sets the plan's image",
    )
    cwd: str = Field(
        default="", description="working directory of each command (empty: the plan's workdir)"
    )
    env: dict[str, str] = Field(
        default_factory=dict[str, str],
        description="variables added to each command's environment",
    )
    forward_env: list[str] = Field(
        default_factory=list[str],
        description="variables of the host's environment passed on where set (`env` wins)",
    )
    timeout: int = Field(default=30, gt=0, description="seconds a command may run")
    interpreter: list[str] = Field(
        default_factory=lambda: ["bash", "-lc"],
        min_length=1,
        description="what runs each command, the command appended as its last argument",
    )

    @model_validator(mode="after")
    def _image_in_plan(self) -> Self:
        if self.image is not None:
            self.plan = self.plan.model_copy(update={"image": self.image})
        return self
