"""The Harbor environment's kwargs (`--ek KEY=VALUE`, or `environment.kwargs` in a job file)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from corral.core.credentials import CredentialRoute

#: The corral.owner label of everything a Harbor run opens, unless provider_config sets one;
#: `corral gc --env ID --owner harbor` collects what a killed run left once it expires.
DEFAULT_OWNER = "harbor"
#: what a withheld variable reads in the sandbox: a key's place, holding no key (SDKs that
#: insist on one still start, and the route's proxy adds the real one)
WITHHELD = "corral-credential-route"


class HarborEnvironmentConfig(BaseModel):
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
    credential_env: dict[str, str] = Field(
        default={},
        description="env variable -> route name: in every command of the main service the "
        "variable is the route's URL, whatever Harbor gave (e.g. OPENAI_BASE_URL: model)",
    )
    withhold_env: tuple[str, ...] = Field(
        default=(),
        description="env variables Harbor would hand the sandbox (the agent's API keys) that "
        f"never reach it: replaced by {WITHHELD!r} in the task's env and every command's",
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
        for variable, route in self.credential_env.items():
            if route not in self.credentials:
                raise ValueError(
                    f"credential_env {variable!r} names route {route!r}, which credentials "
                    f"does not define (routes: {', '.join(self.credentials) or 'none'})"
                )
        return self

    def withheld(self, env: dict[str, str] | None) -> dict[str, str] | None:
        """`env` with the withheld variables' values replaced."""
        if env is None or not self.withhold_env:
            return env
        return {k: WITHHELD if k in self.withhold_env else v for k, v in env.items()}

    def routed(self, env: dict[str, str] | None, urls: dict[str, str]) -> dict[str, str] | None:
        """`env` withheld (`withheld`) and the routed variables set to their route's URL
        (`urls`: route name -> URL)."""
        given = self.withheld(env)
        if not self.credential_env:
            return given
        return {**(given or {}), **{k: urls[r] for k, r in self.credential_env.items()}}

    def provider_params(self) -> dict[str, Any]:
        return {"owner": DEFAULT_OWNER, **self.provider_config}
