"""The Harbor environment's kwargs (`--ek KEY=VALUE`, or `environment.kwargs` in a job file)."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, model_validator

from corral.adapters.credential_env import RoutedEnv
from corral.core.credentials import CredentialRoute

#: The corral.owner label of everything a Harbor run opens, unless provider_config sets one;
#: `corral gc --env ID -p owner=harbor` collects what a killed run left once it expires.
DEFAULT_OWNER = "harbor"
#: Providers whose commands see the host's filesystem: Harbor's fixed absolute paths
#: (/logs, /tests, /solution) would be the host's, written as whoever runs Harbor.
HOST_FILESYSTEM = frozenset({"local"})


class HarborEnvironmentConfig(RoutedEnv):
    """What selects and configures the corral provider behind a Harbor environment."""

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    provider: str = Field(default="docker", description="corral provider id (`corral list env`)")
    provider_config: dict[str, Any] = Field(
        default_factory=dict[str, Any],
        description="the provider's config fields (`corral config docs env ID`); "
        f"owner defaults to {DEFAULT_OWNER!r}",
    )
    image: str | None = Field(
        default=None,
        description="sandbox image; overrides the task's docker_image and environment/Dockerfile",
    )
    startup_timeout_s: float = Field(
        default=300.0, gt=0, description="seconds corral may take to open the sandbox"
    )
    credentials: dict[str, CredentialRoute] = Field(
        default={},
        description="credential routes of every trial's sandbox (`plan.credentials`): the "
        "agent reaches each upstream through corral's proxy, never holding its headers",
    )
    # Harbor passes these two to every environment's options model.
    auto_mounting: bool = Field(
        default=False,
        description="bind Harbor's log directories from the host: never, corral moves files "
        "through its own API (Harbor refuses True)",
    )
    suppress_override_warnings: bool = Field(
        default=False, exclude=True, description="deprecated in Harbor; no effect"
    )

    @model_validator(mode="after")
    def _routes_named(self) -> HarborEnvironmentConfig:
        self.check_routes(self.credentials)
        return self

    @model_validator(mode="after")
    def _own_filesystem(self) -> HarborEnvironmentConfig:
        if self.provider in HOST_FILESYSTEM:
            raise ValueError(
                f"provider {self.provider!r} runs commands on the host's filesystem, where "
                "Harbor's fixed absolute paths (/logs, /tests, /solution) would be the "
                "host's; Harbor needs a sandbox with a filesystem of its own: use docker or k8s"
            )
        return self

    def provider_params(self) -> dict[str, Any]:
        return {"owner": DEFAULT_OWNER, **self.provider_config}
