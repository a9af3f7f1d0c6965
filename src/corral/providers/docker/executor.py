"""How a Docker session runs a command: one small interface, two implementations.

`PlainExecutor` is one engine exec per command (`execution.run_exec`). `ChannelExecutor`
(`channel.py`) keeps one helper process per sandbox and falls back to the plain path
whenever the helper cannot serve a call exactly as the engine would. Both take the
session's `ExecRequest` (`corral.core.session`), checked and normalized once by
`EnvironmentSession.exec`. The `Executor` interface is the shared one
(`corral.helper.channel`).
"""

from __future__ import annotations

from corral.core.session import ExecRequest, ExecResult
from corral.helper.channel import Executor, Stateless
from corral.providers.docker.engine import Engine
from corral.providers.docker.execution import run_exec

__all__ = ["Executor", "PlainExecutor"]


class PlainExecutor(Stateless):
    """One engine exec per command; `shell` kills a timed-out one's tree (`kill_tree`)."""

    def __init__(self, engine: Engine, container: str, shell: tuple[str, ...] = ("sh",)) -> None:
        self.engine = engine
        self.container = container
        self.shell = shell

    async def run(self, request: ExecRequest) -> ExecResult:
        return await run_exec(self.engine, self.container, request, self.shell)
