"""The corral deployment's config, a member of SWE-ReX's family of deployment configs: a
pydantic model with a `type` discriminator and `get_deployment()`, so that
`swerex.deployment.get_deployment(CorralDeploymentConfig(...))` builds it and it
round-trips through JSON and YAML like SWE-ReX's own."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import ConfigDict, Field

from corral.adapters.provider import ProviderChoice
from corral.core.plan import ExecutionPlan

if TYPE_CHECKING:
    from corral.adapters.swerex.deployment import CorralDeployment

#: The corral.owner label of every sandbox a SWE-ReX deployment opens, unless the config
#: sets one (`corral gc --env ID -p owner=swerex` collects what a killed run left).
DEFAULT_OWNER = "swerex"


class CorralDeploymentConfig(ProviderChoice):
    """Configuration for running SWE-ReX's runtime in a corral sandbox (any provider)."""

    model_config = ConfigDict(extra="forbid")

    default_owner: ClassVar[str] = DEFAULT_OWNER

    plan: ExecutionPlan = Field(
        default_factory=ExecutionPlan,
        description="image, workdir, env, resources and network schedule of the sandbox",
    )
    type: Literal["corral"] = Field(
        default="corral", description="Discriminator for (de)serialization/CLI. Do not change."
    )

    def get_deployment(self) -> CorralDeployment:
        from corral.adapters.swerex.deployment import CorralDeployment

        return CorralDeployment.from_config(self)
