"""Inspect's `write_file`/`read_file` on a corral session, as the sandbox's default user.

Writes go through `exec` (stdin into `cat`), so they are subject to that user's
permissions and the file belongs to that user. Reads move the bytes with `download` first:
its size limit, a missing path, a directory and anything but a regular file are decided
on corral's side, so nothing the sandbox's own `sh` or `stat` prints decides them. Only
then is the path checked as that user for readability: like Inspect's own Docker sandbox,
a file whose owner has no read bit is refused even to root.
"""

from __future__ import annotations

import errno
import stat
import tempfile
from pathlib import Path

import anyio
from inspect_ai.util import OutputLimitExceededError, SandboxEnvironmentLimits

from corral.core.session import EnvironmentSession
from corral.errors import TransferLimitExceeded

#: Launched by absolute path with a pinned PATH: these commands are ours, not the agent's,
#: so nothing a sandbox user put on the image's PATH may stand in for them.
SHELL = "/bin/sh"
SYSTEM_PATH = "PATH=/usr/bin:/bin:/usr/sbin:/sbin"
WRITE_TIMEOUT_S = 600
CHECK_TIMEOUT_S = 60

_WRITE = SYSTEM_PATH + '; mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
_CHECK = (
    SYSTEM_PATH + '; if [ -d "$1" ]; then echo directory; elif [ ! -e "$1" ]; then echo missing; '
    'elif [ ! -r "$1" ]; then echo denied; else stat -L -c "file %a" -- "$1"; fi'
)


async def write_file(
    session: EnvironmentSession, file: str, contents: str | bytes, *, service: str | None = None
) -> None:
    data = contents.encode("utf-8") if isinstance(contents, str) else contents
    result = await session.exec(
        [SHELL, "-c", _WRITE, "sh", _placed(session, file, service)],
        stdin=data,
        timeout=WRITE_TIMEOUT_S,
        service=service,
    )
    if result.timed_out:
        raise TimeoutError(f"writing {file!r} took longer than {WRITE_TIMEOUT_S} s")
    if result.returncode == 0:
        return
    message = result.stderr.strip() or result.stdout.strip()
    if "is a directory" in message.lower():
        raise IsADirectoryError(errno.EISDIR, "Is a directory", file)
    if "permission denied" in message.lower():
        raise PermissionError(errno.EACCES, "Permission denied", file)
    raise RuntimeError(f"writing {file!r} in the sandbox failed: {message}")


async def read_file(session: EnvironmentSession, file: str, *, service: str | None = None) -> bytes:
    with tempfile.TemporaryDirectory(prefix="corral-inspect-") as tmp:
        local = Path(tmp) / "file"
        try:
            await session.download(
                file,
                local,
                service=service,
                max_bytes=SandboxEnvironmentLimits.MAX_READ_FILE_SIZE,
            )
        except TransferLimitExceeded:
            raise OutputLimitExceededError(
                SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, truncated_output=None
            ) from None
        await _check_readable(session, file, service)
        return await anyio.Path(local).read_bytes()


async def _check_readable(session: EnvironmentSession, file: str, service: str | None) -> None:
    result = await session.exec(
        [SHELL, "-c", _CHECK, "sh", _placed(session, file, service)],
        timeout=CHECK_TIMEOUT_S,
        service=service,
    )
    verdict = result.stdout.split()
    if result.returncode != 0 or not verdict:
        raise RuntimeError(f"checking {file!r} in the sandbox failed: {result.stderr.strip()}")
    match verdict:
        case ["directory"]:
            raise IsADirectoryError(errno.EISDIR, "Is a directory", file)
        case ["missing"]:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", file)
        case ["file", mode] if set(mode) <= set("01234567") and int(mode, 8) & stat.S_IRUSR:
            return
        case _:
            raise PermissionError(errno.EACCES, "Permission denied", file)


def _placed(session: EnvironmentSession, file: str, service: str | None) -> str:
    # A service has its own filesystem; the sandbox's may be the host's (`local`).
    return file if service is not None else session.resolve_path(file)
