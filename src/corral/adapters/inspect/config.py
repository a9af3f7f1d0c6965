"""The `corral` sandbox's configuration: which provider, its config, and the plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from inspect_ai.util import SandboxEnvironmentLimits
from pydantic import BaseModel, ConfigDict, Field, model_validator

from corral.adapters.credential_env import RoutedEnv
from corral.adapters.provider import ProviderChoice
from corral.compose import plan_from_compose
from corral.core.environment import ENVIRONMENTS
from corral.core.plan import ExecutionPlan
from corral.workspace.options import BindingConfig

#: The corral.owner label of everything an Inspect eval opens, unless the config sets one;
#: `task_cleanup` and `inspect sandbox cleanup corral` collect expired resources under it.
DEFAULT_OWNER = "inspect"


class CorralSandboxConfig(ProviderChoice, RoutedEnv):
    """`sandbox=("corral", CorralSandboxConfig(...))`, or a path to this model as JSON."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    default_owner: ClassVar[str] = DEFAULT_OWNER

    plan: ExecutionPlan = Field(
        description="image, workdir, env, resources and network schedule of each sample's sandbox"
    )
    bindings: tuple[BindingConfig, ...] = Field(
        default=(),
        description="workspaces bound to each sample's sandbox at sample_init and finalized at "
        "sample_cleanup (`corral.workspace` options, each with its `kind`: sync, git, none)",
    )

    @model_validator(mode="after")
    def _routes_named(self) -> CorralSandboxConfig:
        self.check_routes(self.plan.credentials)
        return self

    def adapter_defaults(self, provider: str) -> dict[str, Any]:
        """The owner, and Inspect's output limit (`OutputLimitExceededError` past it)
        where the provider has one."""
        defaults = super().adapter_defaults(provider)
        if "output_limit_bytes" in ENVIRONMENTS.get(provider).config_model.model_fields:
            defaults["output_limit_bytes"] = SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE
        return defaults

    def __hash__(self) -> int:
        # Inspect keys its sandbox caches by the config; the dict fields defeat pydantic's hash.
        return hash(self.model_dump_json())


def load_config(config: BaseModel | str | None) -> CorralSandboxConfig:
    """The config Inspect hands over: the model itself, its dict form, a JSON file path, or
    a compose file (`.yaml`/`.yml`: the docker provider, the file read by `corral.compose`)."""
    if isinstance(config, CorralSandboxConfig):
        return config
    if isinstance(config, str) and Path(config).suffix in (".yaml", ".yml"):
        return CorralSandboxConfig(plan=plan_from_compose(config))
    if isinstance(config, str):
        return CorralSandboxConfig.model_validate_json(Path(config).read_text(encoding="utf-8"))
    if config is None:
        raise ValueError(
            "the corral sandbox needs a config: sandbox=('corral', CorralSandboxConfig(...)) "
            "or sandbox=('corral', 'path/to/config.json')"
        )
    return CorralSandboxConfig.model_validate(config.model_dump())
