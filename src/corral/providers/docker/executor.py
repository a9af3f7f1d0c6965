"""How a Docker session runs a command: one small interface, two implementations.

`PlainExecutor` is one engine exec per command (`execution.run_exec`). `ChannelExecutor`
(`channel.py`) keeps one helper process per sandbox and falls back to the plain path
whenever the helper cannot serve a call exactly as the engine would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from corral.core.output import DEFAULT_OUTPUT_LIMIT
from corral.core.session import ExecResult, OutputCallback
from corral.providers.docker.engine import Engine
from corral.providers.docker.execution import run_exec


@dataclass(frozen=True)
class ExecRequest:
    """One command, its arguments already normalized by the session."""

    args: list[str]
    env: dict[str, str] = field(default_factory=dict[str, str])
    workdir: str | None = None  # None: the container's working directory
    user: str | None = None  # None: the container's user
    stdin: bytes | None = None
    timeout: float | None = None
    on_output: OutputCallback | None = None
    output_limit: int = DEFAULT_OUTPUT_LIMIT  # bytes of each stream kept


class Executor(Protocol):
    async def run(self, request: ExecRequest) -> ExecResult:
        """Run `request` under the session contract (`EnvironmentSession.exec`)."""
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
            request.args,
            env=request.env,
            workdir=request.workdir,
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
