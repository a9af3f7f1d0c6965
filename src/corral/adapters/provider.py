"""Which corral provider an adapter opens its sandboxes with: the part every adapter's
config starts from (the provider's id, its own config, the owner label by default), and
how a sandbox opened with a provider of its own is closed."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from corral.core.environment import ENVIRONMENTS, BaseEnvironment
from corral.core.session import EnvironmentSession


class ProviderChoice(BaseModel):
    """A corral provider and its config; subclasses add what their harness needs."""

    model_config = ConfigDict(extra="forbid")

    #: the corral.owner label of what the adapter opens, unless `provider_config` sets one
    #: (`corral gc --owner ...` collects what a killed run left once it expires)
    default_owner: ClassVar[str] = "corral"

    provider: str = Field(default="docker", description="corral provider id (`corral list env`)")
    provider_config: dict[str, Any] = Field(
        default_factory=dict[str, Any],
        description="the provider's config fields (`corral config docs env ID`); the owner "
        "label defaults to the adapter's (inspect, swerex, minisweagent)",
    )

    def provider_params(self) -> dict[str, Any]:
        return {"owner": self.default_owner, **self.provider_config}

    def environment(self) -> BaseEnvironment:
        """The provider, built from these fields (its config validated)."""
        return ENVIRONMENTS.create(self.provider, **self.provider_params())


async def close_alone(session: EnvironmentSession) -> None:
    """Close `session` and then the environment made for it alone (its engine or API
    client): an adapter that builds a provider per sandbox leaves no connection behind."""
    environment = session.environment
    if environment is None:
        return
    try:
        await environment.close(session)
    finally:
        await environment.aclose()
