"""Runtimes whose sandboxes run on a kernel of their own (gVisor's `runsc`), and what the
engine's view of such a sandbox lacks.

The engine's `top` lists that kernel's processes by its own pids (or not at all), so a
restart is shown by the new sandbox process instead: nothing outlives its kernel. And
gVisor mounts a tmpfs of its own on an empty `/tmp`, which the engine's archive calls
(corral's file transfers) never see; the sandbox gets a volume there instead, labelled
like the session's other objects and removed with its container.
"""

from __future__ import annotations

from docker.types import Mount

from corral.providers.docker.mounts import parse_mount

#: runtimes whose sandboxes run on a kernel of their own
OWN_KERNEL = frozenset({"runsc"})


def own_tmp(runtime: str | None, labels: dict[str, str], mounts: list[str]) -> list[Mount] | None:
    """The sandbox's `/tmp` volume under a runtime in `OWN_KERNEL`, unless the config
    mounts something there itself (`mounts`)."""
    if runtime not in OWN_KERNEL or any(parse_mount(m).container == "/tmp" for m in mounts):
        return None
    return [Mount("/tmp", None, type="volume", labels=labels)]
