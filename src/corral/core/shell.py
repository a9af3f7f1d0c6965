"""A persistent shell: one long-lived shell process whose state (cwd, variables,
functions, aliases) carries from one `run` to the next.

Where a result ends is never read from the output. The shell runs with a third stream,
its fd 3 (`StartRequest.status_fd`), which each command runs without (`3>&-`); after the
command the shell writes `<nonce> <status>` there, the nonce fresh for each run and never
in the command's reach (its stdin is `/dev/null`). The process manager records what fd 3
carries only after everything written before it to stdout and stderr, so the output that
precedes a status is exactly the command's, whatever the command prints.

fd 3 stays within the command's reach all the same (root opens `/proc/$PPID/fd/3`), so
what it carries is read as hostile: at most `STATUS_BUDGET` bytes per run, each line of
the shape the shell writes (`<16 hex> <status>`), parsed in one pass. Anything else is
not a status: the shell is killed and says why on this and every later `run`.

The shell is interactive (`-i`, without a terminal and without job control), which is
what lets an interrupt (SIGINT to its process group) end the running command, a loop of
builtins included, and leave the shell reading its next command. A timed-out command is
interrupted; if the shell does not come back, every other process of its group is
killed; if it still does not, the shell is killed and says so on the next `run`.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import shlex
import signal
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from types import TracebackType

import anyio

from corral.core.capture import Capture
from corral.core.processes import Gap, Item, ProcessExited, ProcessManager, StartRequest
from corral.core.session import TIMEOUT_RETURNCODE, ExecResult
from corral.errors import ProcessNotFound, ProviderError

#: seconds a command gets to stop after an interrupt, then after its group is killed
GRACE_S = 2.0
#: the status of a command `Shell.interrupt` ended, as a shell gives one SIGINT ended
INTERRUPTED = 130
#: bash where the image has it (aliases, `set +H`), else the image's sh; both interactive
#: so that SIGINT ends the command, not the shell
START = (
    "if command -v bash >/dev/null 2>&1; then exec bash --noprofile --norc --noediting -i; fi; "
    "exec sh -i"
)
#: quiet prompts, no history, aliases expanded
SETUP = (
    "set +o history 2>/dev/null; set +H 2>/dev/null; shopt -s expand_aliases 2>/dev/null; "
    "unset HISTFILE"
)
PROMPTS = {"PS1": "", "PS2": "", "PS4": "+ "}
#: bytes fd 3 may carry in one run: a status line is at most 21 bytes, a run writes a few
STATUS_BUDGET = 4096
_STATUS_LINE = re.compile(rb"([0-9a-f]{16}) ([0-9]{1,3})")


class StatusViolation(Exception):
    """fd 3 carried something no shell of corral's writes there."""


class StatusLines:
    """fd 3's lines as `(token, status)`, from its bytes as they arrive: every byte is
    scanned once and copied at most twice, whatever the chunks, and at most
    `STATUS_BUDGET` of them are taken per run."""

    def __init__(self) -> None:
        self._partial = bytearray()
        self._taken = 0

    def next_run(self) -> None:
        self._taken = len(self._partial)

    def feed(self, data: bytes) -> list[tuple[str, int]]:
        self._taken += len(data)
        if self._taken > STATUS_BUDGET:
            raise StatusViolation(f"over {STATUS_BUDGET} bytes in one run")
        scanned = len(self._partial)
        self._partial += data
        cut = self._partial.rfind(b"\n", scanned)
        if cut < 0:
            return []
        complete = bytes(self._partial[:cut])
        del self._partial[: cut + 1]
        return [_status_line(line) for line in complete.split(b"\n")]


def _status_line(line: bytes) -> tuple[str, int]:
    match = _STATUS_LINE.fullmatch(line)
    if match is None:
        raise StatusViolation(f"{line[:40]!r}, not a status line")
    return match[1].decode(), int(match[2])


def shell_request(request: StartRequest) -> StartRequest:
    """The start of a persistent shell for `session.shell(cwd, env, user, service)`."""
    return StartRequest(
        ("sh", "-c", START),
        cwd=request.cwd,
        env={**PROMPTS, **request.env},
        user=request.user,
        service=request.service,
        stdin=True,
        name="shell",
        buffer_bytes=request.buffer_bytes,
        status_fd=True,
    )


class Shell:
    """A shell from `session.shell()`; `run` one command at a time, then `close()`."""

    def __init__(self, manager: ProcessManager, id: str, output_limit: int) -> None:
        self._manager = manager
        self.id = id
        self._output_limit = output_limit
        self._stack = AsyncExitStack()
        self._items: AsyncIterator[Item] | None = None
        self._status = StatusLines()
        self._lock = anyio.Lock()
        #: tokens of the interrupts sent while the current `run` runs: each ends it (130)
        self._interrupts: set[str] = set()
        #: why the shell can run nothing more, once it cannot
        self.dead: str | None = None

    @classmethod
    async def start(cls, manager: ProcessManager, request: StartRequest, limit: int) -> Shell:
        id = await manager.start(shell_request(request))
        shell = cls(manager, id, limit)
        try:
            await shell._begin()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await shell.close()
            raise
        return shell

    async def _begin(self) -> None:
        self._items = await self._stack.enter_async_context(self._manager.attach(self.id, 0))
        # What the shell says as it starts (no job control, no terminal) is no result's.
        with anyio.fail_after(10):
            token = secrets.token_hex(8)
            await self._send(SETUP, token)
            await self._until({token}, Capture(self._output_limit, None))

    async def __aenter__(self) -> Shell:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def run(self, command: str, *, timeout: float | None = None) -> ExecResult:
        """Run `command` in the shell; its state stays for the next one. A timeout
        interrupts it (`timed_out=True`, returncode 124) and keeps the shell usable."""
        if not isinstance(command, str) or not command.strip() or "\0" in command:  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f"shell command {command!r} must be a non-empty string without NUL")
        async with self._lock:
            if self.dead is not None:
                raise ProviderError(f"shell {self.id!r} can run nothing more: {self.dead}")
            capture = Capture(self._output_limit, None)
            token = secrets.token_hex(8)
            self._interrupts.clear()  # an earlier command's are not this one's
            self._status.next_run()
            finished = False
            try:
                await self._send(f"{{ eval {shlex.quote(command)}\n}} </dev/null 3>&-", token)
                with anyio.move_on_after(timeout):
                    code = await self._until({token}, capture)
                    finished = True
                    return capture.result(code)
            finally:
                if not finished:
                    with anyio.CancelScope(shield=True):
                        await self._stop(capture)
            return capture.result(TIMEOUT_RETURNCODE, timed_out=True)

    async def interrupt(self) -> None:
        """Ctrl-C for the command running now: SIGINT to the shell's process group. The
        `run` awaiting it returns with status 130 (`INTERRUPTED`) and what the command
        printed; the shell goes on. With no command running it interrupts nothing."""
        if self.dead is not None:
            raise ProviderError(f"shell {self.id!r} can run nothing more: {self.dead}")
        if not self._lock.locked():
            return  # a signal to an idle interactive shell would only print a newline
        token = secrets.token_hex(8)
        self._interrupts.add(token)
        await self._manager.signal(self.id, int(signal.SIGINT))
        await anyio.sleep(0.05)  # the shell handles it before it reads the next line
        await self._send(":", token)

    async def close(self) -> None:
        """Kill the shell and whatever it runs; idempotent."""
        if self.dead is None:
            self.dead = "it was closed"
        with anyio.CancelScope(shield=True):
            try:
                await self._manager.kill(self.id)
            finally:
                await self._stack.aclose()

    async def _send(self, line: str, token: str) -> None:
        # The status goes out on fd 3 after the line's last command, in the same line: an
        # interrupt that aborts the line aborts it too.
        await self._manager.write(self.id, f"{line}; printf '{token} %d\\n' \"$?\" >&3\n".encode())

    async def _until(self, tokens: set[str], capture: Capture) -> int:
        """Collect output until fd 3 says one of `tokens`; its status."""
        assert self._items is not None
        async for item in self._items:
            if isinstance(item, ProcessExited):
                self.dead = f"it exited ({item.code})"
                return item.code
            if isinstance(item, Gap):
                continue  # counted by the ring; the result's own bounds say what was cut
            stream, data = item
            if stream != "status":
                await capture.emit(stream, data)
                continue
            try:
                lines = self._status.feed(data)
            except StatusViolation as exc:
                self.dead = (
                    f"its status stream (fd 3) broke its budget (STATUS_BUDGET: {STATUS_BUDGET} "
                    f"bytes a run, each line '<16 hex> <status>'): {exc}"
                )
                raise ProviderError(f"shell {self.id!r} was killed: {self.dead}") from None
            for said, status in lines:
                if said in tokens:
                    return status
                if said in self._interrupts:
                    return INTERRUPTED
        self.dead = "its output ended"
        raise ProviderError(f"shell {self.id!r} ended without a status")

    async def _stop(self, capture: Capture) -> None:
        """After a run that did not finish: interrupt its command, or kill a shell that
        can run nothing more."""
        if self.dead is None:
            await self._interrupt(capture)
            return
        with contextlib.suppress(ProviderError, ProcessNotFound):  # the run's error stands
            await self._manager.kill(self.id)

    async def _interrupt(self, capture: Capture) -> None:
        """End the running command and wait for the shell to read again, or kill it."""
        for signum, spare_leader in ((signal.SIGINT, False), (signal.SIGKILL, True)):
            try:
                await self._manager.signal(self.id, int(signum), spare_leader=spare_leader)
                await anyio.sleep(0.05)  # the shell handles it before it reads the next line
                token = secrets.token_hex(8)
                await self._send(":", token)
                with anyio.move_on_after(GRACE_S):
                    await self._until({token}, capture)
                    return
            except ProviderError as exc:
                self.dead = f"interrupting it failed: {exc}"
                break
        if self.dead is None:
            self.dead = "a timed-out command would not stop, so the shell was killed"
        await self._manager.kill(self.id)
