"""Which corral provider an adapter opens its sandboxes with: the part every adapter's
config starts from (the provider's id, its own config, the owner label by default), and
how a sandbox opened with a provider of its own is closed."""

from __future__ import annotations

from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from corral.core.environment import ENVIRONMENTS, BaseEnvironment
from corral.core.session import EnvironmentSession
from corral.providers.configs import ProviderConfig, environment_for


class ProviderChoice(BaseModel):
    """A corral provider and its config; subclasses add what their harness needs.

    Either `config`, a built-in provider's typed config (`corral.ProviderConfig`, told
    apart by its `type`), or `provider` and `provider_config`, the id and fields of any
    installed provider (what a harness's command line or JSON file gives)."""

    model_config = ConfigDict(extra="forbid")

    #: the corral.owner label of what the adapter opens, unless the config sets one
    #: (`corral gc --env ID -p owner=OWNER` collects what a killed run left once it expires)
    default_owner: ClassVar[str] = "corral"

    provider: str = Field(default="docker", description="corral provider id (`corral list env`)")
    provider_config: dict[str, Any] = Field(
        default_factory=dict[str, Any],
        description="the provider's config fields (`corral config docs env ID`); the owner "
        "label defaults to the adapter's (inspect, swerex, minisweagent)",
    )
    config: ProviderConfig | None = Field(
        default=None,
        description="a built-in provider's typed config (DockerConfig, KubernetesConfig, "
        "LocalConfig: `type` names it), instead of provider and provider_config",
    )

    @model_validator(mode="after")
    def _one_choice(self) -> Self:
        if self.config is not None and (
            "provider" in self.model_fields_set or "provider_config" in self.model_fields_set
        ):
            raise ValueError(
                f"give config (here a {self.config.type!r} config) or provider and "
                "provider_config, not both"
            )
        return self

    def adapter_defaults(self, provider: str) -> dict[str, Any]:
        """Config fields this adapter sets unless the config gives them (the owner)."""
        del provider
        return {"owner": self.default_owner}

    def provider_params(self) -> dict[str, Any]:
        """`provider_config` with the adapter's defaults under it."""
        return {**self.adapter_defaults(self.provider), **self.provider_config}

    def environment(self) -> BaseEnvironment:
        """The provider, built from these fields (its config validated)."""
        if self.config is None:
            return ENVIRONMENTS.create(self.provider, **self.provider_params())
        unset = {
            name: value
            for name, value in self.adapter_defaults(self.config.type).items()
            if name not in self.config.model_fields_set
        }
        return environment_for(self.config.model_copy(update=unset))


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
