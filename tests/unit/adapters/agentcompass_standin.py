"""A MINIMAL STAND-IN for AgentCompass's environment contract, for unit tests only.

Not AgentCompass: it copies only the shape corral's adapter relies on (from
`agentcompass.runtime` 1.0.1: `base.BaseEnvironment`/`EnvironmentSession`/`EnvRecord`,
`config.component`, `models.ExecResult`, `network`, `resources`, `registry`), so that the
mapping runs where AgentCompass (Python >= 3.12) cannot be installed. The real package is
exercised by tests/integration/adapters/test_agentcompass_docker.py.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields
from typing import Any

from corral.adapters.agentcompass.contract import Contract


class NetworkMode(enum.StrEnum):
    PUBLIC = "public"
    NO_NETWORK = "no-network"
    ALLOWLIST = "allowlist"
    DENYLIST = "denylist"


class NetworkAllowlistEntryType(enum.StrEnum):
    HOSTNAME = "hostname"
    WILDCARD_HOSTNAME = "wildcard-hostname"
    IPV4_ADDRESS = "ipv4-address"
    IPV6_ADDRESS = "ipv6-address"
    IPV4_CIDR = "ipv4-cidr"
    IPV6_CIDR = "ipv6-cidr"


class ResourceField(enum.StrEnum):
    CPU = "cpu"
    MEMORY_MB = "memory_mb"
    STORAGE_MB = "storage_mb"
    GPU = "gpu"


@dataclass
class NetworkPolicy:
    network_mode: str = "public"
    allowed_hosts: list[Any] = field(default_factory=list[Any])
    denied_hosts: list[Any] = field(default_factory=list[Any])

    @classmethod
    def from_value(cls, value: Any) -> NetworkPolicy:
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(network_mode=value)
        return cls(**value)

    def model_dump(self) -> dict[str, Any]:
        return {
            "network_mode": self.network_mode,
            "allowed_hosts": list(self.allowed_hosts),
            "denied_hosts": list(self.denied_hosts),
        }


@dataclass
class ExecResult:
    returncode: int
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False


def config_field(*, description: str = "", **kwargs: Any) -> Any:
    return field(metadata={"description": description}, **kwargs)


@dataclass(slots=True)
class RuntimeEnvironmentConfig:
    @classmethod
    def from_params(cls, params: dict[str, Any]) -> Any:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"unknown parameters: {', '.join(unknown)}")
        return cls(**params)


@dataclass
class EnvRecord:
    environment: Any
    close_params: dict[str, Any]

    @classmethod
    def create(cls, environment: Any, close_params: dict[str, Any]) -> EnvRecord:
        return cls(environment, dict(close_params))

    async def close(self) -> bool:
        await self.environment.close(**self.close_params)
        return True


class EnvironmentSession:
    env_record: EnvRecord | None = None
    default_workdir: str | None = None
    env_variables: dict[str, str] = {}  # noqa: RUF012

    async def close(self) -> bool:
        assert self.env_record is not None
        return await self.env_record.close()

    async def resolve_path(self, path: str) -> str:
        if path.startswith("/") or self.default_workdir is None:
            return path
        return f"{self.default_workdir}/{path}"

    async def resolve_workdir(self, cwd: str | None) -> str | None:
        value = cwd if cwd is not None else self.default_workdir
        return None if value is None else await self.resolve_path(value)

    def _merge_exec_env(
        self, env: dict[str, str] | None, *, required_env: dict[str, str] | None = None
    ) -> dict[str, str] | None:
        return {**(env or {}), **(required_env or {})} or None

    @staticmethod
    def _validate_exec_command(command: list[str] | str, *, shell: bool) -> list[str] | str:
        if shell != isinstance(command, str):
            raise ValueError("shell=True takes a string, shell=False a list")
        return command


class BaseEnvironment:
    config_class: Any = None

    def __init__(self) -> None:
        self.config: Any = None

    def resolve_network_policy(self, policy: Any) -> NetworkPolicy:
        return NetworkPolicy.from_value(policy)

    def build_config(self, req: Any, plan: Any) -> Any:
        params = {**plan.environment.params, **plan.environment.setup}
        self.config = self.config_class.from_params(params)
        return self.config


class Registry:
    def __init__(self) -> None:
        self.entries: dict[str, Any] = {}

    def register(self) -> Any:
        def decorator(cls: Any) -> Any:
            self.entries[cls.id] = cls
            return cls

        return decorator

    def names(self) -> list[str]:
        return sorted(self.entries)

    def create(self, name: str) -> Any:
        return self.entries[name]()


def contract() -> Contract:
    return Contract(
        BaseEnvironment=BaseEnvironment,
        EnvironmentSession=EnvironmentSession,
        RuntimeEnvironmentConfig=RuntimeEnvironmentConfig,
        config_field=config_field,
        EnvRecord=EnvRecord,
        ExecResult=ExecResult,
        NetworkPolicy=NetworkPolicy,
        NetworkMode=NetworkMode,
        NetworkAllowlistEntryType=NetworkAllowlistEntryType,
        ResourceField=ResourceField,
        ENVIRONMENTS=Registry(),
    )
