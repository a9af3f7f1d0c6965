"""A description of the machine and engine the benchmarks ran on, for the report."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def _first(path: str, prefix: str) -> str:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line.split(":", 1)[-1].split("=", 1)[-1].strip().strip('"')
    except OSError:
        pass
    return "unknown"


def describe(raw: Any) -> dict[str, Any]:
    info: dict[str, Any] = raw.info()
    return {
        "cpu": _first("/proc/cpuinfo", "model name"),
        "cores": os.cpu_count(),
        "memory_gib": round(int(info.get("MemTotal", 0)) / 2**30, 1),
        "os": _first("/etc/os-release", "PRETTY_NAME"),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "docker": f"{info.get('ServerVersion')} "
        f"({info.get('Driver')}, {info.get('DefaultRuntime')})",
    }


def summary_line(machine: dict[str, Any]) -> str:
    return (
        f"{machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB, "
        f"{machine['os']}, kernel {machine['kernel']}, Docker {machine['docker']}, "
        f"Python {machine['python']}"
    )
