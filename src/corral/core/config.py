"""Provider configuration: one frozen pydantic model per provider, documented from itself."""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple, cast, get_args

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
