"""A SWE-ReX bash session as a corral shell (`session.shell()`).

SWE-ReX's own session drives bash on a terminal with pexpect and finds the end of each
command by its prompt, then by an `echo` of `$?`: output can forge both. Here each action
is `shell.run`, whose end and status come on a descriptor of the shell's own with a fresh
token, never from the output. What an action gives back follows SWE-ReX's `BashSession`:

- Before it runs, the command is checked by `bash -n` (`sh -n` where the image has no
  bash), in the sandbox: a syntax error raises `BashIncorrectSyntaxError`, with
  `bash_stdout` and `bash_stderr` in its `extra_info`.
- The output is stdout and stderr as one stream, as a terminal shows them (the session's
  stderr is its stdout from the start), without the terminal: no `\\r\\n`, no echo, and
  programs that colour only on a terminal print plain text.
- `check="raise"` raises `NonZeroExitCodeError` on a non-zero status, `"silent"` returns
  it, `"ignore"` returns None. `timeout` raises `CommandTimeoutError`; the command is
  already interrupted then (SIGINT, then SIGKILL to what is left of its process group)
  and the session goes on, so a later `BashInterruptAction` has nothing left to stop; one
  sent while a command runs is Ctrl-C for it (`Shell.interrupt`): its action gives exit
  code 130 and what it printed until then.
- A command runs with stdin at its end (`/dev/null`): interactive programs
  (`is_interactive_command`, `is_interactive_quit`) are refused; use `session.start`
  with a pty for them. `expect` strings do not end a command early: it runs to its end.
"""

from __future__ import annotations

import shlex

from swerex.exceptions import BashIncorrectSyntaxError, CommandTimeoutError, NonZeroExitCodeError
from swerex.runtime.abstract import (
    BashAction,
    BashInterruptAction,
    BashObservation,
    CreateBashSessionRequest,
    CreateBashSessionResponse,
)

from corral.core.session import EnvironmentSession
from corral.core.shell import Shell

#: checks a script's syntax, read on stdin, as the session's shell would parse it
_SYNTAX = (
    "sh",
    "-c",
    "if command -v bash >/dev/null 2>&1; then exec bash -n; fi; exec sh -n",
)
#: seconds the syntax check may take
SYNTAX_TIMEOUT_S = 30.0


class BashSession:
    """One named session of the runtime: a corral shell."""

    def __init__(self, session: EnvironmentSession, shell: Shell) -> None:
        self._session = session
        self.shell = shell

    @classmethod
    async def start(
        cls, session: EnvironmentSession, request: CreateBashSessionRequest
    ) -> tuple[BashSession, CreateBashSessionResponse]:
        shell = await session.shell()
        try:
            # One stream, as on SWE-ReX's terminal: the shell's stderr is its stdout.
            await shell.run("exec 2>&1")
            output = ""
            for path in request.startup_source:
                result = await shell.run(f". {shlex.quote(path)}", timeout=request.startup_timeout)
                output += result.stdout + result.stderr
                if result.timed_out:
                    raise CommandTimeoutError(
                        f"timeout after {request.startup_timeout} seconds while sourcing {path!r}"
                    )
        except BaseException:
            await shell.close()
            raise
        return cls(session, shell), CreateBashSessionResponse(output=output)

    async def run(self, action: BashAction) -> BashObservation:
        if action.is_interactive_command or action.is_interactive_quit:
            raise NotImplementedError(
                "corral's bash sessions give each command a closed stdin: drive an interactive "
                "program through session.start(..., pty=PtySize()) instead"
            )
        if not action.command.strip():
            return BashObservation(output="", exit_code=0)
        await self._check_syntax(action.command)
        result = await self.shell.run(action.command, timeout=action.timeout)
        if result.timed_out:
            raise CommandTimeoutError(
                f"timeout after {action.timeout} seconds while running command {action.command!r}"
            )
        output = result.stdout + result.stderr
        if action.check == "ignore":
            return BashObservation(output=output, exit_code=None)
        if action.check == "raise" and result.returncode != 0:
            message = (
                f"Command {action.command!r} failed with exit code {result.returncode}. "
                f"Here is the output:\n{output!r}"
            )
            if action.error_msg:
                message = f"{action.error_msg}: {message}"
            raise NonZeroExitCodeError(message)
        return BashObservation(output=output, exit_code=result.returncode)

    async def interrupt(self, action: BashInterruptAction) -> BashObservation:
        """Ctrl-C for the command running now, if any (a timed-out one was interrupted
        already): its `run_in_session` gives exit code 130 and its output so far; the
        session goes on."""
        await self.shell.interrupt()
        return BashObservation(output="", exit_code=0)

    async def close(self) -> None:
        await self.shell.close()

    async def _check_syntax(self, command: str) -> None:
        checked = await self._session.exec(list(_SYNTAX), stdin=command, timeout=SYNTAX_TIMEOUT_S)
        if checked.ok:
            return
        if checked.timed_out:
            raise CommandTimeoutError(
                f"checking the syntax of {command!r} took over {SYNTAX_TIMEOUT_S} s"
            )
        raise BashIncorrectSyntaxError(
            f"Error (exit code {checked.returncode}) while checking bash command \n{command!r}\n"
            f"---- Stderr ----\n{checked.stderr}\n---- Stdout ----\n{checked.stdout}",
            extra_info={"bash_stdout": checked.stdout, "bash_stderr": checked.stderr},
        )
