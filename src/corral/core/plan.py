"""The execution plan: what to run, where, with what resources and network schedule."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol, Self, runtime_checkable

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from corral.core.credentials import CredentialRoute, check_route_names
from corral.core.redact import masked_env
from corral.errors import ConfigError, ImageRequired
from corral.network.policy import NetworkSchedule, PolicyLike

ImageSource = Literal["native", "image", "task_image", "fallback_image"]
IMAGE_PRIORITY: tuple[ImageSource, ...] = ("native", "image", "task_image", "fallback_image")
#: A service's name: a DNS label short enough for a Kubernetes container name and a
#: Docker container name suffix.
SERVICE_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?")


class Resources(BaseModel):
    """Resource requests; unset fields mean the provider's default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cpu: float | None = Field(default=None, gt=0, description="CPU cores (may be fractional)")
    memory_mb: int | None = Field(default=None, gt=0, description="memory limit in MiB")
    disk_mb: int | None = Field(default=None, gt=0, description="writable disk in MiB")
    gpus: int | None = Field(default=None, ge=0, description="number of GPUs")
    placement: dict[str, str] | None = Field(
        default=None, description="provider placement constraints (node labels)"
    )

    def merged_over(self, hint: Resources) -> Resources:
        """Each explicit field beats the hint; unset fields inherit it."""
        values = {
            name: getattr(self, name) if getattr(self, name) is not None else getattr(hint, name)
            for name in type(self).model_fields
        }
        return Resources.model_validate(values)


class Timeouts(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    startup_s: float = Field(default=120.0, gt=0, description="seconds open() may take")
    operation_s: float | None = Field(
        default=None, gt=0, description="default seconds for one exec when none is given"
    )
    idle_s: float | None = Field(default=None, gt=0, description="seconds a sandbox may sit unused")
    max_lifetime_s: float | None = Field(
        default=None,
        gt=0,
        description="seconds after which the sandbox ends (docker, k8s: by itself, even with no "
        "corral process left) and gc collects what remains",
    )


def _mask_env_of(data: Any) -> Any:
    """`data` (a model's raw input) with its `env` masked by its `public_env_names`."""
    if not isinstance(data, Mapping):
        return data
    fields: Mapping[str, Any] = data  # pyright: ignore[reportUnknownVariableType]
    env: Any = fields.get("env")
    public: Any = fields.get("public_env_names", ())
    if not isinstance(env, Mapping) or not isinstance(public, Collection):
        return fields
    masked: dict[str, Any] = masked_env(env, public)  # pyright: ignore[reportUnknownArgumentType]
    return {**fields, "env": masked}


def _check_env_names(value: dict[str, str | SecretStr]) -> dict[str, str | SecretStr]:
    for name in value:
        if not name or "=" in name or "\0" in name:
            raise ValueError(f"environment variable name {name!r} is not valid")
    return value


def _check_image(value: str) -> str:
    if not value.strip() or any(c.isspace() for c in value):
        raise ValueError(f"image {value!r} must be a non-empty name without whitespace")
    return value


def _check_workdir(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"workdir {value!r} must be an absolute path")
    return value


ImageName = Annotated[str, AfterValidator(_check_image)]
AbsolutePath = Annotated[str, AfterValidator(_check_workdir)]
Env = Annotated[dict[str, str | SecretStr], AfterValidator(_check_env_names)]


class Healthcheck(BaseModel):
    """A command run inside a service until it exits 0: `open()` returns only once every
    service with one is healthy (within `timeouts.startup_s`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    test: list[str] | str = Field(
        description="a list runs without a shell, a string through `sh -c`"
    )
    interval_s: float = Field(default=0.5, gt=0, description="seconds between attempts")
    timeout_s: float = Field(default=10.0, gt=0, description="seconds one attempt may take")
    retries: int = Field(default=120, ge=1, description="failed attempts after which open() fails")
    start_period_s: float = Field(default=0.0, ge=0, description="seconds before the first attempt")

    @field_validator("test")
    @classmethod
    def _test(cls, value: list[str] | str) -> list[str] | str:
        if (isinstance(value, str) and not value.strip()) or (
            isinstance(value, list) and (not value or any("\0" in a for a in value))
        ):
            raise ValueError(f"healthcheck test {value!r} must be a non-empty command")
        return value

    def argv(self) -> list[str]:
        return ["sh", "-c", self.test] if isinstance(self.test, str) else list(self.test)


class ServiceSpec(BaseModel):
    """A container beside the sandbox (a database, a web app, a grader): it shares the
    sandbox's network namespace, so both reach each other on localhost, and its policy.
    `exec(..., service=name)` and the file calls with `service=name` reach it."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    image: ImageName
    command: list[str] | None = Field(
        default=None, description="replaces the image's command; None: the image's own"
    )
    env: Env = Field(
        default={}, description="its processes' environment; secret-looking names are masked"
    )
    public_env_names: frozenset[str] = frozenset()
    healthcheck: Healthcheck | None = None
    resources: Resources = Resources()
    workdir: AbsolutePath | None = None

    @model_validator(mode="before")
    @classmethod
    def _mask_env_first(cls, data: Any) -> Any:
        return _mask_env_of(data)


class ExecutionPlan(BaseModel):
    """Everything a provider needs to open one sandbox. Derive with `model_copy(update=...)`.

    Env values whose names look like credentials (`*KEY*`, `*TOKEN*`, `*SECRET*`,
    `*PASSWORD*`, `AUTH`, `DSN`, ...) are kept as `SecretStr`, so reprs, logs, persisted
    plans and validation errors never show them; `public_env_names` exempts a name.
    """

    # Inputs stay out of validation errors: a bad field would otherwise print the env.
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    image: ImageName | None = None
    native: dict[str, Any] | None = Field(
        default=None, description="provider-native selector (build context, snapshot, pod template)"
    )
    task_image: ImageName | None = None
    fallback_image: ImageName | None = None
    resources: Resources = Resources()
    task_resources: Resources = Resources()
    workdir: AbsolutePath | None = None
    env: Env = Field(
        default={},
        description="environment of the sandbox's processes; values may be SecretStr, and "
        "are made one where the name looks like a credential",
    )
    public_env_names: frozenset[str] = Field(
        default=frozenset(),
        description="env names that look like credentials but hold no secret: their values "
        "are shown in reprs, logs and persisted plans",
    )
    command: list[str] | None = None
    timeouts: Timeouts = Timeouts()
    network: NetworkSchedule = NetworkSchedule()
    labels: dict[str, str] = {}
    tags: tuple[str, ...] = ()
    benchmark: str | None = None
    task_id: str | None = None
    services: dict[str, ServiceSpec] = Field(
        default={},
        description="containers beside the sandbox, by name, under its network namespace "
        "and policy (providers declaring `supports_services`)",
    )
    credentials: dict[str, CredentialRoute] = Field(
        default={},
        description="routes by name to upstreams whose headers the sandbox never sees: it "
        "gets CORRAL_CRED_<NAME>_URL, corral's proxy (providers declaring "
        "`supports_credentials`)",
    )

    if TYPE_CHECKING:
        # What validation accepts, so that the documented forms type-check:
        # ExecutionPlan(network="no-network"). tests/unit/test_plan.py keeps it in step.
        def __init__(
            self,
            *,
            image: str | None = None,
            native: dict[str, Any] | None = None,
            task_image: str | None = None,
            fallback_image: str | None = None,
            resources: Resources = ...,
            task_resources: Resources = ...,
            workdir: str | None = None,
            env: Mapping[str, str | SecretStr] = ...,
            public_env_names: Collection[str] = ...,
            command: list[str] | None = None,
            timeouts: Timeouts = ...,
            network: NetworkSchedule | PolicyLike = ...,
            labels: dict[str, str] = ...,
            tags: tuple[str, ...] = (),
            benchmark: str | None = None,
            task_id: str | None = None,
            services: dict[str, ServiceSpec] = ...,
            credentials: dict[str, CredentialRoute] = ...,
        ) -> None: ...

    @field_validator("credentials")
    @classmethod
    def _route_names(cls, value: dict[str, CredentialRoute]) -> dict[str, CredentialRoute]:
        return check_route_names(value)

    @field_validator("services")
    @classmethod
    def _service_names(cls, value: dict[str, ServiceSpec]) -> dict[str, ServiceSpec]:
        for name in value:
            if not SERVICE_NAME.fullmatch(name):
                raise ValueError(
                    f"service name {name!r} must be 1-32 of [a-z0-9-], starting and ending "
                    "with a letter or digit"
                )
        return value

    @model_validator(mode="before")
    @classmethod
    def _mask_env_first(cls, data: Any) -> Any:
        # Before any field is checked: an error, here or in a model holding a plan, shows
        # its input, and that input must already be masked.
        return _mask_env_of(data)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with `update` validated as the constructor validates it: `network="public"`
        becomes a schedule, an unknown field or a bad value is a `ValidationError` naming
        it, env values are masked."""
        if not update:
            return super().model_copy(deep=deep)
        given = {name: getattr(self, name) for name in self.model_fields_set}
        copied = self.model_validate({**given, **update})
        return copied.model_copy(deep=True) if deep else copied

    def image_source(self) -> ImageSource | None:
        """Which field wins: native > image > task_image > fallback_image."""
        for source in IMAGE_PRIORITY:
            if getattr(self, source):
                return source
        return None

    def resolved(self) -> ExecutionPlan:
        """The winner kept, the losing image fields dropped, resources merged over hints."""
        winner = self.image_source()
        update: dict[str, Any] = {source: None for source in IMAGE_PRIORITY if source != winner}
        update["resources"] = self.resources.merged_over(self.task_resources)
        update["task_resources"] = Resources()
        return self.model_copy(update=update)

    def require_image(self, provider: str) -> str | dict[str, Any]:
        resolved = self.resolved()
        source = resolved.image_source()
        if source is None:
            raise ImageRequired(
                f"provider {provider!r} needs an image: set one of native, image, "
                "task_image or fallback_image on the plan"
            )
        value: str | dict[str, Any] = getattr(resolved, source)
        return value

    def persisted(self) -> dict[str, Any]:
        """A JSON-safe dump with every secret value masked."""
        return self.model_dump(mode="json")


@runtime_checkable
class Recipe(Protocol):
    """Per-benchmark defaults. `apply` returns a copy and never touches an SDK."""

    @property
    def id(self) -> str: ...

    def matches(self, plan: ExecutionPlan, provider_id: str) -> bool: ...

    def apply(self, plan: ExecutionPlan) -> ExecutionPlan: ...


class FallbackImageRecipe(BaseModel):
    """The common recipe: a benchmark's default image, written only as `fallback_image`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    benchmark: str
    fallback_image: str
    providers: frozenset[str] | None = None

    def matches(self, plan: ExecutionPlan, provider_id: str) -> bool:
        return plan.benchmark == self.benchmark and (
            self.providers is None or provider_id in self.providers
        )

    def apply(self, plan: ExecutionPlan) -> ExecutionPlan:
        return plan.model_copy(update={"fallback_image": self.fallback_image})


class RecipeRegistry:
    def __init__(self, recipes: Iterable[Recipe] = ()) -> None:
        self._recipes: dict[str, Recipe] = {}
        for recipe in recipes:
            self.register(recipe)

    def register(self, recipe: Recipe) -> Recipe:
        if recipe.id in self._recipes:
            raise ConfigError(f"recipe id {recipe.id!r} is already registered")
        self._recipes[recipe.id] = recipe
        return recipe

    def find(self, plan: ExecutionPlan, provider_id: str) -> Recipe | None:
        found = [r for r in self._recipes.values() if r.matches(plan, provider_id)]
        if len(found) > 1:
            ids = ", ".join(sorted(r.id for r in found))
            raise ConfigError(
                f"recipes {ids} all match benchmark {plan.benchmark!r} on provider "
                f"{provider_id!r}; at most one may"
            )
        return found[0] if found else None

    def apply(self, plan: ExecutionPlan, provider_id: str) -> ExecutionPlan:
        recipe = self.find(plan, provider_id)
        return plan if recipe is None else recipe.apply(plan)


RECIPES = RecipeRegistry()
