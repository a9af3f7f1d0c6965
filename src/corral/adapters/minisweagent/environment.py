"""`CorralEnvironment`: mini-swe-agent's `Environment` protocol on a corral session.

Each action runs as mini-swe-agent's own Docker environment runs it: a fresh
`interpreter` (`bash -lc` by default) with the command as its last argument, in `cwd` (or
the plan's workdir), with `env` and the forwarded variables added, stdout and stderr as
one stream, for at most `timeout` seconds (then its whole tree is killed and the
observation says so, with the output so far). Output whose first line is
`COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` from a command that succeeded raises `Submitted`
with the rest as the submission. A failure to run a command at all is an observation
too (returncode -1 and the error), as in mini-swe-agent's environments.

Built from its config (`environment_class: corral.adapters.minisweagent.CorralEnvironment`
and `CorralEnvironmentConfig`'s keys), it opens its own sandbox, driven from a thread of
its own; `cleanup()` closes it. mini-swe-agent itself never calls `cleanup()`: an
environment dropped without it closes its sandbox in the background, and one still open
when the process exits is closed by an exit hook, which waits at most `EXIT_WAIT` seconds
for them all (the loop's thread is a daemon: nothing else holds the process). Built on a
session of the caller's (`CorralEnvironment(session=..., ...)`, say inside a `TaskRun`),
it leaves the session to its owner and is called from a worker thread of that session's loop
(`await anyio.to_thread.run_sync(agent.run, task)`).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import logging
import os
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, cast

from minisweagent.exceptions import Submitted
from minisweagent.utils.serialize import (
    recursive_merge as _recursive_merge,  # pyright: ignore[reportUnknownVariableType]  # its dicts are untyped
)

from corral.adapters.commands import merged
from corral.adapters.minisweagent.bridge import Bridge, CallerLoop, OwnLoop
from corral.adapters.minisweagent.config import CorralEnvironmentConfig
from corral.adapters.provider import close_alone
from corral.core.session import EnvironmentSession

#: mini-swe-agent's own merge of template variables (its environments all use it)
recursive_merge = cast(Callable[..., dict[str, Any]], _recursive_merge)
#: the first line of a command's output that ends the agent's run with a submission
SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
#: the fields of Python's `platform.uname()`, as the sandbox's `uname` says them
_UNAME = ("system", "node", "release", "version", "machine")
_UNAME_SCRIPT = "uname -s; uname -n; uname -r; uname -v; uname -m"
#: seconds the process's exit waits, in all, for the sandboxes its environments left open
EXIT_WAIT = 30.0
_log = logging.getLogger("corral.adapters.minisweagent")


class _Owned:
    """A sandbox an environment opened, and the loop it opened it on; in `_OPEN` until
    it is closed."""

    def __init__(self, loop: OwnLoop, session: EnvironmentSession) -> None:
        self.loop = loop
        self.session = session
        _OPEN.add(self)

    def end(self) -> Future[None]:
        """Close the sandbox and end the loop, without waiting; idempotent."""
        return self.loop.last(self._close)

    async def _close(self) -> None:
        try:
            await close_alone(self.session)
        finally:
            _OPEN.discard(self)


#: sandboxes opened by environments and not closed yet: what the exit hook closes
_OPEN: set[_Owned] = set()


@atexit.register
def _close_left_open() -> None:
    left = {owned.end(): owned.session.id for owned in list(_OPEN)}
    done, pending = concurrent.futures.wait(left, timeout=EXIT_WAIT)
    for future in done:
        if (error := future.exception()) is not None:
            _log.warning("corral sandbox %s did not close at exit: %s", left[future], error)
    if pending:
        ids = ", ".join(sorted(left[future] for future in pending))
        _log.warning(
            "corral sandboxes %s did not close within %s s of exit; "
            "`corral gc --env ID -p owner=OWNER` removes them once they expire",
            ids,
            EXIT_WAIT,
        )


class CorralEnvironment:
    def __init__(
        self,
        *,
        config_class: type[CorralEnvironmentConfig] = CorralEnvironmentConfig,
        logger: logging.Logger | None = None,
        session: EnvironmentSession | None = None,
        **kwargs: Any,
    ) -> None:
        """An environment in a corral sandbox; kwargs as `CorralEnvironmentConfig`."""
        self.logger = logger or logging.getLogger("corral.adapters.minisweagent")
        self.config = config_class(**kwargs)
        self._uname: dict[str, str] | None = None
        self._owned: _Owned | None = None
        if session is None:
            loop = OwnLoop()
            self._bridge: Bridge = loop
            try:
                session = loop.call(lambda: self.config.environment().open(self.config.plan))
            except BaseException:
                loop.last(_nothing)
                raise
            self._owned = _Owned(loop, session)
            self.logger.info("opened corral sandbox %s", session.id)
        else:
            self._bridge = CallerLoop()
        self.session: EnvironmentSession | None = session

    def execute(
        self, action: dict[str, Any], cwd: str = "", *, timeout: int | None = None
    ) -> dict[str, Any]:
        """Run the action's `command`; its output, returncode and exception_info."""
        command: str = action.get("command", "")
        seconds = timeout or self.config.timeout
        env = {key: os.environ[key] for key in self.config.forward_env if key in os.environ}
        env.update(self.config.env)
        session = self._session()
        args = merged([*self.config.interpreter, command])
        try:
            result = self._bridge.call(
                lambda: session.exec(
                    args, cwd=cwd or self.config.cwd or None, env=env, timeout=seconds
                )
            )
        except Exception as exc:
            output = _failed(type(exc).__name__, str(exc), "")
        else:
            if result.timed_out:
                # What mini-swe-agent's own environments say (subprocess.TimeoutExpired).
                said = f"Command '{command}' timed out after {seconds} seconds"
                output = _failed("TimeoutExpired", said, result.stdout)
            else:
                output = {
                    "output": result.stdout,
                    "returncode": result.returncode,
                    "exception_info": "",
                }
        self._check_finished(output)
        return output

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """The config's fields, the sandbox's `uname` (system, release, version, machine,
        node), then `kwargs`."""
        return recursive_merge(self.config.model_dump(), self._sandbox_uname(), kwargs)

    def serialize(self) -> dict[str, Any]:
        # The provider's config as its validated model dumps it: credentials masked.
        environment: dict[str, Any] = self.config.model_dump(
            mode="json", exclude={"provider_config"}
        )
        session = self.session
        if session is not None and session.environment is not None:
            environment["provider_config"] = session.environment.config.model_dump(mode="json")
        return {
            "info": {
                "config": {
                    "environment": environment,
                    "environment_type": f"{type(self).__module__}.{type(self).__name__}",
                }
            }
        }

    def cleanup(self) -> None:
        """Close the sandbox this environment opened (not a caller's); idempotent."""
        self.session = None
        if self._owned is not None:
            self._owned.end().result()

    def __del__(self) -> None:
        # Never waits: the garbage collector may run this on the loop's own thread, or
        # at the interpreter's exit, where the exit hook has closed what was left.
        owned = getattr(self, "_owned", None)
        if owned is not None:
            with contextlib.suppress(Exception):
                owned.end()

    def _session(self) -> EnvironmentSession:
        if self.session is None:
            raise RuntimeError("this environment was cleaned up: it can run nothing more")
        return self.session

    def _check_finished(self, output: dict[str, Any]) -> None:
        lines = str(output.get("output", "")).lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {
                    "role": "exit",
                    "content": submission,
                    "extra": {"exit_status": "Submitted", "submission": submission},
                }
            )

    def _sandbox_uname(self) -> dict[str, str]:
        if self._uname is None:
            session = self._session()
            said = self._bridge.call(lambda: session.exec(["sh", "-c", _UNAME_SCRIPT]))
            lines = said.stdout.splitlines()
            self._uname = dict(zip(_UNAME, lines, strict=False)) if said.ok else {}
        return self._uname


async def _nothing() -> None:
    return None


def _failed(kind: str, message: str, output: str) -> dict[str, Any]:
    """The observation of a command that failed to run or to end (as mini-swe-agent's)."""
    return {
        "output": output,
        "returncode": -1,
        "exception_info": f"An error occurred while executing the command: {message}",
        "extra": {"exception_type": kind, "exception": message},
    }
