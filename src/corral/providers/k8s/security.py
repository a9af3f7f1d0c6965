"""The container `securityContext` a sandbox Pod may have: an allowlist, in the Pod's words.

Keys are the Pod spec's. Anything not modelled here is refused (`privileged`, `procMount`,
`windowsOptions`, unknown keys), and so are the values that undo confinement: privilege
escalation, an `Unconfined` seccomp or AppArmor profile, the `spc_t` SELinux type,
capabilities outside the safe set (those go, named, in the config's `unsafe_capabilities`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from corral.core.privileges import SafeCapabilities


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Capabilities(_Strict):
    drop: tuple[str, ...] = ("ALL",)
    add: SafeCapabilities = ()

    @model_validator(mode="after")
    def _drops_all(self) -> Capabilities:
        if "ALL" not in (c.upper() for c in self.drop):
            raise ValueError(
                f"capabilities.drop {list(self.drop)!r} must include ALL: the runtime's "
                "defaults hold NET_RAW"
            )
        return self


class SeccompProfile(_Strict):
    type: Literal["RuntimeDefault", "Localhost"]
    localhostProfile: str | None = None

    @model_validator(mode="after")
    def _profile(self) -> SeccompProfile:
        if (self.type == "Localhost") != (self.localhostProfile is not None):
            raise ValueError(
                "seccompProfile.localhostProfile is set exactly when type is Localhost"
            )
        return self


class AppArmorProfile(SeccompProfile):
    pass


class SELinuxOptions(_Strict):
    user: str | None = None
    role: str | None = None
    type: Literal["container_t", "container_init_t"] | None = None
    level: str | None = None


class SecurityContext(_Strict):
    runAsUser: int | None = Field(default=None, ge=0)
    runAsGroup: int | None = Field(default=None, ge=0)
    runAsNonRoot: bool | None = None
    readOnlyRootFilesystem: bool | None = None
    allowPrivilegeEscalation: Literal[False] = False
    capabilities: Capabilities = Capabilities(
        add=("CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "KILL")
    )
    seccompProfile: SeccompProfile = SeccompProfile(type="RuntimeDefault")
    appArmorProfile: AppArmorProfile | None = None
    seLinuxOptions: SELinuxOptions | None = None
    procMount: Literal["Default"] | None = None

    def manifest(self, unsafe_capabilities: tuple[str, ...]) -> dict[str, Any]:
        """The Pod spec's securityContext, with the config's named opt-ins added."""
        body = self.model_dump(mode="json", exclude_none=True)
        body["capabilities"]["add"] = [*self.capabilities.add, *unsafe_capabilities]
        return body
