"""The Linux capabilities a sandbox may keep: a safe set, opt-ins, and what is never granted.

Capabilities are checked against an allowlist, not a blocklist: a name corral has not
judged (`SYS_MODULE`, `DAC_READ_SEARCH`, `SYS_PTRACE`, `BPF`, ...) is refused unless the
config names it in an `unsafe_capabilities` field, which every open logs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated

from pydantic import AfterValidator

#: capabilities(7), without the `CAP_` prefix.
LINUX_CAPABILITIES = frozenset(
    {
        "AUDIT_CONTROL",
        "AUDIT_READ",
        "AUDIT_WRITE",
        "BLOCK_SUSPEND",
        "BPF",
        "CHECKPOINT_RESTORE",
        "CHOWN",
        "DAC_OVERRIDE",
        "DAC_READ_SEARCH",
        "FOWNER",
        "FSETID",
        "IPC_LOCK",
        "IPC_OWNER",
        "KILL",
        "LEASE",
        "LINUX_IMMUTABLE",
        "MAC_ADMIN",
        "MAC_OVERRIDE",
        "MKNOD",
        "NET_ADMIN",
        "NET_BIND_SERVICE",
        "NET_BROADCAST",
        "NET_RAW",
        "PERFMON",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_ADMIN",
        "SYS_BOOT",
        "SYS_CHROOT",
        "SYS_MODULE",
        "SYS_NICE",
        "SYS_PACCT",
        "SYS_PTRACE",
        "SYS_RAWIO",
        "SYS_RESOURCE",
        "SYS_TIME",
        "SYS_TTY_CONFIG",
        "SYSLOG",
        "WAKE_ALARM",
    }
)

#: Docker's default set minus NET_RAW: what ordinary workloads (apt, useradd, su) need.
SAFE_CAPABILITIES = (
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
    "MKNOD",
    "AUDIT_WRITE",
    "SETFCAP",
)

#: Never granted, opt-in or not: with them the sandbox changes or sidesteps its own
#: network rules (ALL holds them all).
NEVER_GRANTED = frozenset({"NET_ADMIN", "NET_RAW", "SYS_ADMIN", "ALL"})


def _names(values: Iterable[str]) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(v.upper().removeprefix("CAP_") for v in values))
    never = [n for n in names if n in NEVER_GRANTED]
    if never:
        raise ValueError(
            f"{', '.join(never)}: would let the sandbox change or bypass its network rules, "
            "so never granted"
        )
    unknown = [n for n in names if n not in LINUX_CAPABILITIES]
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not a Linux capability (capabilities(7))")
    return names


def _safe(values: tuple[str, ...]) -> tuple[str, ...]:
    names = _names(values)
    unsafe = [n for n in names if n not in SAFE_CAPABILITIES]
    if unsafe:
        raise ValueError(
            f"{', '.join(unsafe)}: outside the safe set ({', '.join(SAFE_CAPABILITIES)}), "
            "weakening the sandbox's isolation from the host; to grant it anyway, name it in "
            "unsafe_capabilities"
        )
    return names


def _unsafe(values: tuple[str, ...]) -> tuple[str, ...]:
    names = _names(values)
    safe = [n for n in names if n in SAFE_CAPABILITIES]
    if safe:
        raise ValueError(
            f"{', '.join(safe)}: in the safe set; list it with the sandbox's capabilities, "
            "not in unsafe_capabilities"
        )
    return names


#: Capability names from the safe set, normalized (upper case, no `CAP_`).
SafeCapabilities = Annotated[tuple[str, ...], AfterValidator(_safe)]
#: Capability names outside the safe set that a config grants on purpose.
UnsafeCapabilities = Annotated[tuple[str, ...], AfterValidator(_unsafe)]
