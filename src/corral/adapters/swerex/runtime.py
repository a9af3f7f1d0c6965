"""`CorralRuntime`: SWE-ReX's `AbstractRuntime` on a corral session.

Bash sessions are corral shells (`corral.adapters.swerex.bash`); `execute` is
`session.exec`; files move with the session's file calls. Where SWE-ReX's
`LocalRuntime` (what its server runs in a container) is `subprocess.run`:

- `Command`: a list runs without a shell, a string with `shell=True` through `/bin/sh -c`
  (with `shell=True` a list's first item is the script, the rest its `$0`, `$1`...), as
  `subprocess` does; `env` is added to the sandbox's environment (not a replacement);
  `merge_output_streams` puts stderr on stdout's pipe; stdin is at its end; `timeout`
  raises `CommandTimeoutError` once the command's whole tree is killed; output is bounded
  as every corral exec's is (head and tail kept).
- `read_file` decodes as `Path.read_text` would (the request's `encoding`, UTF-8 if it
  gives none, and its `errors`; universal newlines); a missing file raises
  `FileNotFoundError`. `write_file` makes the parent directories. `upload` copies a host
  file or directory to the sandbox.

A runtime can also be built on a session of the caller's (`CorralRuntime(session)`,
say inside a `TaskRun`), which it then never closes: `close()` ends its bash sessions.
"""

from __future__ import annotations

import io
import logging
import posixpath
import tempfile
from pathlib import Path
from typing import Any

import anyio
from swerex.exceptions import (
    CommandTimeoutError,
    NonZeroExitCodeError,
    SessionDoesNotExistError,
    SessionExistsError,
)
from swerex.runtime.abstract import (
    AbstractRuntime,
    Action,
    BashInterruptAction,
    CloseBashSessionResponse,
    CloseResponse,
    CloseSessionRequest,
    CloseSessionResponse,
    Command,
    CommandResponse,
    CreateSessionRequest,
    CreateSessionResponse,
    IsAliveResponse,
    Observation,
    ReadFileRequest,
    ReadFileResponse,
    UploadRequest,
    UploadResponse,
    WriteFileRequest,
    WriteFileResponse,
)

from corral.adapters.commands import merged
from corral.adapters.swerex.bash import BashSession
from corral.core.session import EnvironmentSession
from corral.errors import ProviderError

#: seconds `is_alive` waits for an answer when its call gives no timeout
ALIVE_TIMEOUT_S = 30.0


class CorralRuntime(AbstractRuntime):
    """SWE-ReX's runtime interface on one corral session."""

    def __init__(self, session: EnvironmentSession, *, logger: logging.Logger | None = None):
        super().__init__()
        self.session = session
        self.logger = logger or logging.getLogger("corral.adapters.swerex")
        self._sessions: dict[str, BashSession] = {}

    @property
    def sessions(self) -> dict[str, BashSession]:
        return self._sessions

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        """Alive when the sandbox runs a command (whatever its status) within `timeout`."""
        if self.session.closed:
            return IsAliveResponse(is_alive=False, message=f"session {self.session.id} is closed")
        seconds = timeout or ALIVE_TIMEOUT_S
        try:
            answered = await self.session.exec(["true"], timeout=seconds)
        except ProviderError as exc:
            return IsAliveResponse(is_alive=False, message=str(exc))
        if answered.timed_out:
            return IsAliveResponse(is_alive=False, message=f"no answer within {seconds} s")
        return IsAliveResponse(is_alive=True)

    async def create_session(self, request: CreateSessionRequest) -> CreateSessionResponse:
        if request.session in self._sessions:
            raise SessionExistsError(f"session {request.session} already exists")
        bash, response = await BashSession.start(self.session, request)
        if request.session in self._sessions:  # made meanwhile by a concurrent call
            await bash.close()
            raise SessionExistsError(f"session {request.session} already exists")
        self._sessions[request.session] = bash
        return response

    async def run_in_session(self, action: Action) -> Observation:
        bash = self._session_named(action.session)
        if isinstance(action, BashInterruptAction):
            return await bash.interrupt(action)
        return await bash.run(action)

    async def close_session(self, request: CloseSessionRequest) -> CloseSessionResponse:
        bash = self._session_named(request.session)
        del self._sessions[request.session]
        await bash.close()
        return CloseBashSessionResponse()

    async def execute(self, command: Command) -> CommandResponse:
        args = subprocess_argv(command)
        result = await self.session.exec(
            merged(args) if command.merge_output_streams else args,
            cwd=command.cwd,
            env=command.env,
            timeout=command.timeout,
        )
        if result.timed_out:
            raise CommandTimeoutError(
                f"Timeout ({command.timeout}s) exceeded while running command"
            )
        response = CommandResponse(
            stdout=result.stdout, stderr=result.stderr, exit_code=result.returncode
        )
        if command.check and result.returncode != 0:
            message = (
                f"Command {command.command!r} failed with exit code {result.returncode}. "
                f"Stdout:\n{response.stdout!r}\nStderr:\n{response.stderr!r}"
            )
            if command.error_msg:
                message = f"{command.error_msg}: {message}"
            raise NonZeroExitCodeError(message)
        return response

    async def read_file(self, request: ReadFileRequest) -> ReadFileResponse:
        with tempfile.TemporaryDirectory(prefix="corral-swerex-") as tmp:
            local = Path(tmp) / "file"
            await self.session.download(request.path, local)
            data = await anyio.Path(local).read_bytes()
        text = io.TextIOWrapper(
            io.BytesIO(data), encoding=request.encoding or "utf-8", errors=request.errors
        )
        return ReadFileResponse(content=text.read())

    async def write_file(self, request: WriteFileRequest) -> WriteFileResponse:
        parent = posixpath.dirname(request.path)
        if parent:
            made = await self.session.exec(["mkdir", "-p", "--", parent])
            if not made.ok:
                raise OSError(f"cannot make {parent!r} in the sandbox: {made.stderr.strip()}")
        await self.session.write_text(request.path, request.content)
        return WriteFileResponse()

    async def upload(self, request: UploadRequest) -> UploadResponse:
        if await anyio.Path(request.source_path).is_dir():
            await self.session.upload_dir(request.source_path, request.target_path)
        else:
            await self.session.upload(request.source_path, request.target_path)
        return UploadResponse()

    async def close(self) -> CloseResponse:
        """End every bash session (the corral session is its owner's to close)."""
        sessions, self._sessions = list(self._sessions.values()), {}
        with anyio.CancelScope(shield=True):
            for bash in sessions:
                await bash.close()
        return CloseResponse()

    def _session_named(self, name: str) -> BashSession:
        try:
            return self._sessions[name]
        except KeyError:
            raise SessionDoesNotExistError(f"session {name!r} does not exist") from None


def subprocess_argv(command: Command) -> list[str]:
    """`command` as `subprocess.run(command.command, shell=command.shell)` would run it."""
    given: Any = command.command
    if command.shell:
        return ["/bin/sh", "-c", given] if isinstance(given, str) else ["/bin/sh", "-c", *given]
    return [given] if isinstance(given, str) else list(given)
