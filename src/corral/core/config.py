"""Provider configuration: one frozen pydantic model per provider, documented from itself."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, NamedTuple, cast, get_args

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic.fields import FieldInfo


class RuntimeEnvironmentConfig(BaseModel):
    """Base of every provider config. Unknown keys are errors; secrets are `SecretStr`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Groups of fields of which at most one may be set; shown by `corral config docs`.
    mutually_exclusive: ClassVar[tuple[tuple[str, ...], ...]] = ()

    owner: str = Field(
        default="corral",
        min_length=1,
        max_length=63,
        pattern=r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$",
        description="value of the corral.owner label on every resource; gc only touches its own",
    )
    labels: dict[str, str] = Field(
        default_factory=dict[str, str], description="extra labels on every resource"
    )
    default_lifetime_s: float = Field(
        default=6 * 3600.0,
        gt=0,
        description="seconds a sandbox lives when the plan sets no max_lifetime_s; docker and "
        "k8s sandboxes end by themselves then, even with no corral process left, and gc "
        "removes what remains",
    )

    admission: Literal["static", "adaptive"] = Field(
        default="static",
        description="static: an open waits only for max_concurrent_opens; adaptive: it also "
        "waits while the host's free memory or CPU is below admission_min_free_memory_mb or "
        "admission_min_idle_cpu_percent (as the harness's host reads them in /proc)",
    )
    admission_min_free_memory_mb: int = Field(
        default=1024,
        ge=0,
        description="with admission='adaptive': MiB of MemAvailable below which opens wait",
    )
    admission_min_idle_cpu_percent: float = Field(
        default=10.0,
        ge=0,
        lt=100,
        description="with admission='adaptive': percent of all CPUs' time idle below which "
        "opens wait",
    )
    max_opens_per_s: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="opens per second admitted across every process of this user on this "
        "host for this provider (a token bucket shared through a file in the user's runtime "
        "dir; no bursts above it); None: no rate",
    )
    admission_max_wait_s: float = Field(
        default=600.0,
        gt=0,
        allow_inf_nan=False,
        description="seconds an open may wait for admission (adaptive and max_opens_per_s) "
        "before it fails with AdmissionTimeout; not part of timeouts.startup_s",
    )

    @model_validator(mode="after")
    def _adaptive_only(self) -> RuntimeEnvironmentConfig:
        if self.admission != "adaptive":
            for name in ("admission_min_free_memory_mb", "admission_min_idle_cpu_percent"):
                if name in self.model_fields_set:
                    raise ValueError(f"{name} applies only with admission='adaptive'")
        return self

    @model_validator(mode="after")
    def _exclusive(self) -> RuntimeEnvironmentConfig:
        for group in self.mutually_exclusive:
            given = [name for name in group if getattr(self, name) not in (None, False, "", ())]
            if len(given) > 1:
                raise ValueError(f"config fields {', '.join(given)} are mutually exclusive")
        return self

    def opt_ins(self) -> dict[str, str]:
        """Settings in force that weaken the sandbox's boundary, by field name.

        Every field named `unsafe_*` that is set; `open()` logs them at warning level each
        time, so that a weakened sandbox never goes unnoticed.
        """
        found: dict[str, str] = {}
        for name in type(self).model_fields:
            value: object = getattr(self, name)
            if name.startswith("unsafe_") and value:
                items = cast("tuple[object, ...]", value) if isinstance(value, tuple) else (value,)
                found[name] = ",".join(map(str, items))
        return found


class FieldDoc(NamedTuple):
    name: str
    type: str
    default: str
    description: str


def _type_name(info: FieldInfo) -> str:
    annotation = info.annotation
    if get_args(annotation) or not isinstance(annotation, type):
        text = str(annotation)
    else:
        text = annotation.__name__
    return text.replace("typing.", "").replace("pathlib.", "").replace("NoneType", "None")


def config_docs(model: type[RuntimeEnvironmentConfig]) -> list[FieldDoc]:
    """Every field: name, type, default (secrets masked), description."""
    docs: list[FieldDoc] = []
    for name, info in model.model_fields.items():
        if info.default_factory is not None:
            default: Any = info.default_factory()  # type: ignore[call-arg]
        else:
            default = info.default
        shown = "(secret)" if isinstance(default, SecretStr) else repr(default)
        docs.append(FieldDoc(name, _type_name(info), shown, info.description or ""))
    return docs
