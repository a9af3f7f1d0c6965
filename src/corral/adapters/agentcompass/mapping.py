"""AgentCompass's environment values onto corral's: policies, resources, commands, results.

Pure functions on plain values: nothing here imports AgentCompass.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from corral.core.plan import Resources
from corral.core.session import TIMEOUT_RETURNCODE
from corral.core.session import ExecResult as CorralResult
from corral.network.policy import NetworkPolicy, NetworkSchedule

#: AgentCompass resource names -> corral's (`storage_mb` is corral's `disk_mb`).
RESOURCE_NAMES = {"cpu": "cpu", "memory_mb": "memory_mb", "storage_mb": "disk_mb", "gpu": "gpus"}
_DETACH = 'nohup "$@" >/dev/null 2>&1 &'


class PolicyLike(Protocol):
    """AgentCompass's `NetworkPolicy` (a dataclass with `model_dump()`)."""

    def model_dump(self) -> dict[str, Any]: ...


def corral_policy(policy: PolicyLike) -> NetworkPolicy:
    """Same field names and values on both sides: `network_mode`, `allowed_hosts`, ..."""
    return NetworkPolicy.model_validate(policy.model_dump())


def corral_schedule(
    baseline: PolicyLike, run: PolicyLike, evaluation: PolicyLike
) -> NetworkSchedule:
    return NetworkSchedule(
        baseline=corral_policy(baseline),
        run=corral_policy(run),
        evaluation=corral_policy(evaluation),
    )


def corral_resources(resources: Mapping[str, Any]) -> Resources:
    unknown = sorted(set(resources) - set(RESOURCE_NAMES) - {"gpu_type", "ignore_gpu_type"})
    if unknown or resources.get("gpu_type"):
        names = ", ".join(unknown or ["gpu_type"])
        raise ValueError(f"corral cannot enforce resource field(s) {names}")
    values = {RESOURCE_NAMES[k]: v for k, v in resources.items() if k in RESOURCE_NAMES}
    return Resources.model_validate(values)


def corral_command(command: list[str] | str, *, detach: bool) -> list[str]:
    """A (validated) `shell=True` string runs through `sh -c`; `detach` leaves it running."""
    args = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
    return ["/bin/sh", "-c", _DETACH, "sh", *args] if detach else args


def exec_fields(result: CorralResult) -> dict[str, Any]:
    """AgentCompass's `ExecResult(returncode, stdout, stderr, timed_out)` keyword arguments."""
    returncode = TIMEOUT_RETURNCODE if result.returncode is None else result.returncode
    return {
        "returncode": returncode,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "timed_out": result.timed_out,
    }
