"""corral's exec results onto Inspect's exec contract: a result, or the exception it expects."""

from __future__ import annotations

import errno

from inspect_ai.util import ExecResult, OutputLimitExceededError, SandboxEnvironmentLimits

from corral.core.session import ExecResult as CorralResult

#: The exit status of a command that was found but could not be executed (POSIX, runc).
NOT_EXECUTABLE = 126


def to_inspect(result: CorralResult, cmd: list[str], timeout: int | None) -> ExecResult[str]:
    """Raise what Inspect expects for a timeout, truncated output or an unexecutable command."""
    if result.timed_out or result.returncode is None:
        error = TimeoutError(f"command {cmd[0]!r} timed out after {timeout} seconds")
        error.truncated_output = result.stdout + result.stderr  # type: ignore[attr-defined]
        raise error
    if result.stdout_truncated or result.stderr_truncated:
        raise OutputLimitExceededError(
            SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR, truncated_output=result.stdout
        )
    if _not_permitted(result, cmd[0]):
        raise PermissionError(errno.EACCES, "permission denied executing the command", cmd[0])
    return ExecResult(
        success=result.returncode == 0,
        returncode=result.returncode,
        stdout=result.stdout,
        stderr=result.stderr,
    )


def _not_permitted(result: CorralResult, program: str) -> bool:
    """The engine's one-line refusal to start `program` itself (not a message from inside it)."""
    if result.returncode != NOT_EXECUTABLE:
        return False
    lines = (result.stdout + result.stderr).strip().splitlines()
    return len(lines) == 1 and "permission denied" in lines[0].lower() and program in lines[0]
