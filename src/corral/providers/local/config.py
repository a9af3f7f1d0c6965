"""Configuration of the `local` provider."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from corral.core.config import RuntimeEnvironmentConfig
from corral.core.output import DEFAULT_OUTPUT_LIMIT


class LocalConfig(RuntimeEnvironmentConfig):
    """A process tree on this host. Not a security boundary for the filesystem."""

    type: Literal["local"] = Field(
        default="local", description="the provider; picks this config out of a ProviderConfig"
    )
    root_dir: Path | None = Field(
        default=None,
        description="directory under which each session's workspace is created "
        "(default: the system temp dir)",
    )
    inherit_env: tuple[str, ...] = Field(
        default=("PATH", "LANG", "LC_ALL", "TZ"),
        description="host environment variables passed to commands; nothing else leaks in",
    )
    output_limit_bytes: int = Field(
        default=DEFAULT_OUTPUT_LIMIT, ge=1024, description="bytes of stdout/stderr kept per exec"
    )
    end_workload_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="seconds a phase's processes get to die after the session cgroup is "
        "killed before the session is closed",
    )

    session_dir: Path | None = Field(
        default=None,
        description="directory that keeps a record of each open session, so `corral gc` "
        "removes what a killed harness left (default: $XDG_CACHE_HOME/corral/sessions/local)",
    )
    snapshot_dir: Path | None = Field(
        default=None,
        description="directory that keeps `session.save()` copies of workspaces "
        "(default: $XDG_CACHE_HOME/corral/snapshots/local)",
    )
    snapshot_lifetime_s: float = Field(
        default=86400.0,
        gt=0,
        description="seconds a saved workspace is kept before `corral gc` removes it",
    )

    @field_validator("root_dir")
    @classmethod
    def _root_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_dir():
            raise ValueError(f"root_dir {str(value)!r} is not an existing directory")
        return value
