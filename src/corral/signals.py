"""Ending a harness on SIGTERM or SIGHUP the way Ctrl-C does: by cancellation.

Their default action kills the process at once, so nothing a session owns (its processes,
cgroup, workspace, containers, Pod) is removed. Inside `cancelled_on_signals()` the signal
cancels the block instead: every `async with` in it unwinds and closes what it opened, and
the block ends normally with the signal noted. Handlers are the caller's choice, never a
side effect of opening a session: a library must not take over a harness's signals.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager

import anyio
from anyio.abc import TaskStatus

DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Caught:
    """Which signal ended the block (`signum`), or None if it ran to its end."""

    signum: int | None = None

    def received(self, signum: int) -> None:
        self.signum = signum

    @property
    def exit_code(self) -> int | None:
        """The shell's convention for a process ended by the signal: 128 + its number."""
        return None if self.signum is None else 128 + self.signum


@asynccontextmanager
async def cancelled_on_signals(
    *signums: signal.Signals,
) -> AsyncGenerator[Caught]:
    """Cancel the block when one of `signums` (default SIGTERM, SIGHUP) arrives.

    The block's cleanup runs (shielded where corral's is); a second signal during it gets
    the default action, so a stuck cleanup can still be ended. The main thread only.
    """
    caught = Caught()
    failure: BaseException | None = None
    async with anyio.create_task_group() as group:
        await group.start(_watch, signums or DEFAULT_SIGNALS, caught, group.cancel_scope)
        try:
            yield caught
        except anyio.get_cancelled_exc_class():
            raise  # the group ends it if the signal asked, else it goes on out
        except BaseException as exc:
            # Raised past the group, not through it, so it reaches the caller as it was,
            # not inside an exception group.
            failure = exc
        finally:
            group.cancel_scope.cancel()
    if failure is not None:
        raise failure


async def _watch(
    signums: tuple[signal.Signals, ...],
    caught: Caught,
    scope: anyio.CancelScope,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    with anyio.open_signal_receiver(*signums) as received:
        task_status.started()
        async for signum in received:
            caught.received(signum)
            scope.cancel()
            return
