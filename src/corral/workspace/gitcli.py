"""The host's git, run by the harness: against the source repository with the user's
config, and against anything that came from a sandbox with none of it.

Nothing here runs git inside a sandbox, and nothing reads a `.git` a sandbox made. Hooks
are off everywhere (a clone or checkout runs none); in the isolated mode system and global
config are ignored, and no attribute, filter, textconv or external diff the user's config
defines can run on the sandbox's files.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import IO, Literal

import anyio

from corral.errors import ProviderError

Mode = Literal["source", "isolated"]

_ALWAYS = (
    "-c", "core.hooksPath=/dev/null",
    "-c", "core.fsmonitor=false",
    "-c", "protocol.ext.allow=never",
    "-c", "advice.detachedHead=false",
)  # fmt: skip
_ISOLATED = (
    "-c", "core.autocrlf=false",
    "-c", "core.excludesFile=/dev/null",
    "-c", "core.attributesFile=/dev/null",
    "-c", "diff.external=",
)  # fmt: skip


# Where a repository is: inherited (a harness run from a git hook), they would send every
# command to some other repository.
_LOCATION = frozenset(
    {
        "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_COMMON_DIR",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_NAMESPACE", "GIT_PREFIX",
    }
)  # fmt: skip


def _environment(mode: Mode, extra: dict[str, str]) -> dict[str, str]:
    if mode == "isolated":
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        env.update(GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull, GIT_ATTR_NOSYSTEM="1")
    else:
        env = {k: v for k, v in os.environ.items() if k not in _LOCATION}
    return {**env, "GIT_TERMINAL_PROMPT": "0", **extra}


async def git(
    *args: str,
    cwd: Path | None = None,
    mode: Mode = "source",
    env: dict[str, str] | None = None,
    timeout_s: float,
    stdout: IO[bytes] | None = None,
    check: bool = True,
    hide: tuple[str, str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """Run `git args` on the host; a failure raises `ProviderError` with git's message,
    in which `hide[0]` (a URL with credentials) is replaced by `hide[1]`."""
    command = ["git", *_ALWAYS, *(_ISOLATED if mode == "isolated" else ()), *args]
    try:
        with anyio.fail_after(timeout_s):
            result = await anyio.run_process(
                command,
                cwd=cwd,
                env=_environment(mode, env or {}),
                stdout=stdout if stdout is not None else subprocess.PIPE,
                check=False,
            )
    except TimeoutError:
        raise ProviderError(f"git {args[0]} took longer than {timeout_s} s") from None
    if check and result.returncode != 0:
        message = result.stderr.decode("utf-8", errors="replace")
        if hide is not None:
            message = message.replace(*hide)
        message = message.strip()[-2000:]
        raise ProviderError(f"git {args[0]} failed ({result.returncode}): {message}")
    return result


def text(result: subprocess.CompletedProcess[bytes]) -> str:
    return result.stdout.decode("utf-8", errors="replace").strip()
