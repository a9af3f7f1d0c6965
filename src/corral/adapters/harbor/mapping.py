"""Harbor's environment values onto corral's: policies, capabilities, commands, results.

Pure functions on plain values: nothing here imports Harbor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from corral.core.environment import BaseEnvironment
from corral.core.session import ExecResult
from corral.network.policy import NetworkMode, NetworkPolicy, NetworkSchedule
from corral.network.targets import EntryType

#: Harbor's `EnvironmentCapabilities` allowlist flags, by corral entry type.
ENTRY_TYPE_FLAGS = {
    EntryType.HOSTNAME: "network_allowlist_hostnames",
    EntryType.WILDCARD_HOSTNAME: "network_allowlist_wildcard_hostnames",
    EntryType.IPV4_ADDRESS: "network_allowlist_ipv4_addresses",
    EntryType.IPV6_ADDRESS: "network_allowlist_ipv6_addresses",
    EntryType.IPV4_CIDR: "network_allowlist_ipv4_cidrs",
    EntryType.IPV6_CIDR: "network_allowlist_ipv6_cidrs",
}


class PolicyLike(Protocol):
    """Harbor's `NetworkPolicy` (a pydantic model: `network_mode`, `allowed_hosts`)."""

    def model_dump(self, *, mode: str = ...) -> dict[str, Any]: ...


def corral_policy(policy: PolicyLike) -> NetworkPolicy:
    """Same field names and mode values on both sides (Harbor has no `denylist`)."""
    values = policy.model_dump(mode="json")
    hosts: list[str] = values.get("allowed_hosts") or []
    if values["network_mode"] != NetworkMode.ALLOWLIST.value:
        return NetworkPolicy(network_mode=NetworkMode(values["network_mode"]))
    return NetworkPolicy.model_validate({"network_mode": "allowlist", "allowed_hosts": hosts})


def corral_schedule(baseline: PolicyLike, phases: Sequence[PolicyLike]) -> NetworkSchedule:
    """Harbor's startup policy is corral's baseline; its first phase (the agent's, or the
    verifier's in a separate verifier environment) is `run`, the next `evaluation`."""
    start = corral_policy(baseline)
    mapped = [corral_policy(p) for p in phases]
    return NetworkSchedule(
        baseline=start,
        run=mapped[0] if mapped else start,
        evaluation=mapped[1] if len(mapped) > 1 else start,
    )


def capability_flags(provider: type[BaseEnvironment]) -> dict[str, bool]:
    """Harbor's network capability flags: exactly what the corral provider enforces."""
    modes = provider.supported_network_modes
    allowlist = NetworkMode.ALLOWLIST in modes
    flags = {
        "disable_internet": NetworkMode.NO_NETWORK in modes,
        "network_allowlist": allowlist,
        "dynamic_network_policy": provider.supports_dynamic_network_policy,
    }
    for entry_type, flag in ENTRY_TYPE_FLAGS.items():
        flags[flag] = allowlist and entry_type in provider.supported_allowlist_entry_types
    return flags


def ends_phase(new: NetworkPolicy, first_phase: NetworkPolicy | None) -> bool:
    """Whether a switch to `new` ends a phase, so what ran in it must be ended first.

    Harbor switches baseline -> phase -> baseline around the agent's run and again around
    the verifier's. Every switch but the one into the first phase (the agent's) leaves a
    phase, or enters the verifier's after an agent phase that made no switch.
    """
    return first_phase is None or new != first_phase


def shell_command(command: str) -> list[str]:
    """Harbor runs a command string through bash in the main container, as its Docker does."""
    return ["bash", "-c", command]


def exec_fields(result: ExecResult, timeout_s: float | None) -> dict[str, Any]:
    """Harbor's `ExecResult(stdout, stderr, return_code)` keyword arguments.

    A timeout raises, as Harbor's Docker environment does (the process tree is already
    killed by corral).
    """
    if result.timed_out or result.returncode is None:
        raise RuntimeError(f"Command timed out after {timeout_s} seconds")
    return {
        "stdout": result.stdout or None,
        "stderr": result.stderr or None,
        "return_code": result.returncode,
    }


#: Providers that request `resources.gpus` from their engine (Docker device requests,
#: Kubernetes `nvidia.com/gpu` limits); a sandbox without them fails to start.
GPU_PROVIDERS = frozenset({"docker", "k8s"})


def gpu_capable(provider: type[BaseEnvironment]) -> bool:
    return provider.id in GPU_PROVIDERS
