"""How a Docker session runs a command: one small interface, two implementations.

`PlainExecutor` is one engine exec per command (`execution.run_exec`). `ChannelExecutor`
(`channel.py`) keeps one helper process per sandbox and falls back to the plain path
whenever the helper cannot serve a call exactly as the engine would. Both take the
session's `ExecRequest` (`corral.core.session`), checked and normalized once by
`EnvironmentSession.exec`.
"""

from __future__ import annotations

from typing import Protocol

from corral.core.session import ExecRequest, ExecResult
from corral.providers.docker.engine import Engine
from corral.providers.docker.execution import run_exec


class Executor(Protocol):
    async def run(self, request: ExecRequest) -> ExecResult:
        """Run `request` under the session contract (`EnvironmentSession.exec`); its `cwd`
        is absolute or None (the container's working directory), its `user` a name, an id
        or None (the container's user)."""
        ...

    def reset(self) -> None:
        """The sandbox's processes are gone (its container restarted): forget any that
        this executor keeps there. Never blocks."""
        ...

    async def aclose(self) -> None:
        """The session is closing: stop what this executor runs on the harness's side
        (threads, streams), bounded."""
        ...


class PlainExecutor:
    """One engine exec per command."""

    def __init__(self, api: Engine, tokens: int, container: str) -> None:
        self.api = api
        self.tokens = tokens
        self.container = container

    async def run(self, request: ExecRequest) -> ExecResult:
        return await run_exec(
            self.api,
            self.tokens,
            self.container,
            list(request.args),
            env=request.env,
            workdir=request.cwd,
            user=request.user,
            stdin=request.stdin,
            timeout=request.timeout,
            on_output=request.on_output,
            output_limit=request.output_limit,
        )

    def reset(self) -> None:
        pass

    async def aclose(self) -> None:
        pass
