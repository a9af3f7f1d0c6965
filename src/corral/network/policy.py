"""The network policy model (AgentCompass field names) and the per-phase schedule."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, model_validator

from corral.network.targets import NetworkTarget

Phase = Literal["baseline", "run", "evaluation", "evaluation_baseline"]
PHASES: tuple[Phase, ...] = ("baseline", "run", "evaluation", "evaluation_baseline")


class NetworkMode(StrEnum):
    PUBLIC = "public"
    NO_NETWORK = "no-network"
    ALLOWLIST = "allowlist"
    DENYLIST = "denylist"


TargetLike = str | Mapping[str, Any] | NetworkTarget
#: what a policy field accepts: a policy, `"public"`, `"allowlist:host,host"`, a mapping
PolicyLike: TypeAlias = "NetworkPolicy | str | Mapping[str, Any]"


class NetworkPolicy(BaseModel):
    """What a sandbox may reach.

    Parses from `"public"`, `"no-network"`, `"allowlist:a.com,b.com:443"`, a mapping with
    `network_mode`/`allowed_hosts`/`denied_hosts`, or a policy.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    network_mode: NetworkMode = NetworkMode.PUBLIC
    allowed_hosts: tuple[NetworkTarget, ...] = ()
    denied_hosts: tuple[NetworkTarget, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        if isinstance(value, str):
            return _parse_policy_string(value)
        return value

    @model_validator(mode="after")
    def _check(self) -> NetworkPolicy:
        mode = self.network_mode
        if self.allowed_hosts and mode is not NetworkMode.ALLOWLIST:
            raise ValueError(f"allowed_hosts is only valid in allowlist mode, not {mode.value!r}")
        if self.denied_hosts and mode is not NetworkMode.DENYLIST:
            raise ValueError(f"denied_hosts is only valid in denylist mode, not {mode.value!r}")
        if mode is NetworkMode.ALLOWLIST and not self.allowed_hosts:
            raise ValueError("allowlist policy needs at least one entry in allowed_hosts")
        if mode is NetworkMode.DENYLIST and not self.denied_hosts:
            raise ValueError("denylist policy needs at least one entry in denied_hosts")
        object.__setattr__(self, "allowed_hosts", _dedupe(self.allowed_hosts))
        object.__setattr__(self, "denied_hosts", _dedupe(self.denied_hosts))
        return self

    @classmethod
    def public(cls) -> NetworkPolicy:
        return cls(network_mode=NetworkMode.PUBLIC)

    @classmethod
    def no_network(cls) -> NetworkPolicy:
        return cls(network_mode=NetworkMode.NO_NETWORK)

    @classmethod
    def allowlist(cls, *targets: TargetLike) -> NetworkPolicy:
        return cls.model_validate({"network_mode": "allowlist", "allowed_hosts": list(targets)})

    @classmethod
    def denylist(cls, *targets: TargetLike) -> NetworkPolicy:
        return cls.model_validate({"network_mode": "denylist", "denied_hosts": list(targets)})

    @property
    def targets(self) -> tuple[NetworkTarget, ...]:
        return self.allowed_hosts or self.denied_hosts

    def __str__(self) -> str:
        if not self.targets:
            return self.network_mode.value
        return f"{self.network_mode.value}:{','.join(str(t) for t in self.targets)}"


def _dedupe(targets: Iterable[NetworkTarget]) -> tuple[NetworkTarget, ...]:
    return tuple(dict.fromkeys(targets))


def _parse_policy_string(text: str) -> dict[str, Any]:
    mode, sep, rest = text.partition(":")
    mode = mode.strip()
    try:
        parsed = NetworkMode(mode)
    except ValueError:
        modes = ", ".join(m.value for m in NetworkMode)
        raise ValueError(f"unknown network mode {mode!r}; expected one of {modes}") from None
    if parsed in (NetworkMode.PUBLIC, NetworkMode.NO_NETWORK):
        if sep:
            raise ValueError(f"network policy {text!r}: {parsed.value} takes no targets")
        return {"network_mode": parsed}
    entries = [e for e in rest.split(",")] if sep else []
    field = "allowed_hosts" if parsed is NetworkMode.ALLOWLIST else "denied_hosts"
    return {"network_mode": parsed, field: entries}


class NetworkSchedule(BaseModel):
    """The policy for each phase of a task. Unset phases inherit `baseline`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    baseline: NetworkPolicy = Field(default_factory=NetworkPolicy.public)
    run: NetworkPolicy | None = None
    evaluation: NetworkPolicy | None = None
    evaluation_baseline: NetworkPolicy | None = None

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        if isinstance(value, str | NetworkPolicy):
            return {"baseline": value}
        return value

    @model_validator(mode="after")
    def _fill(self) -> NetworkSchedule:
        for phase in ("run", "evaluation", "evaluation_baseline"):
            if getattr(self, phase) is None:
                object.__setattr__(self, phase, self.baseline)
        return self

    if TYPE_CHECKING:
        # What the validators accept, so that the documented forms type-check:
        # NetworkSchedule(baseline="public", run="allowlist:api.example.com:443").
        def __init__(
            self,
            *,
            baseline: PolicyLike = ...,
            run: PolicyLike | None = None,
            evaluation: PolicyLike | None = None,
            evaluation_baseline: PolicyLike | None = None,
        ) -> None: ...

    def policy(self, phase: Phase) -> NetworkPolicy:
        value: NetworkPolicy | None = getattr(self, phase)
        return value if value is not None else self.baseline

    def items(self) -> list[tuple[Phase, NetworkPolicy]]:
        return [(phase, self.policy(phase)) for phase in PHASES]
