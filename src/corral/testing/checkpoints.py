"""Cancel an operation at its Nth checkpoint, and tell what it did with the cancellation.

A checkpoint is a point where the operation's task yields to the event loop: every
`await` that suspends (a thread call, a socket wait, a lock, `anyio.sleep(0)`). The
operation's coroutine is driven by a thin awaitable that forwards every `send`/`throw`
exactly as `yield from` would, and counts what the coroutine yields to the task. At the
Nth yield it cancels an `anyio.CancelScope` around the operation, before the task is
suspended there; anyio delivers that cancellation at this same suspension (the task is
woken with `CancelledError` on the next loop iteration), or, if the task is inside a
shielded scope at that point, at the first checkpoint after the shield ends. So "cancel
at N" is the cancellation a caller's timeout or task group would cause at that moment,
with anyio's real semantics (shields, level cancellation, task groups), and no private
asyncio hook. Child tasks the operation starts are cancelled with it by the scope; only
the operation's own task is counted, which keeps N deterministic for a given code path.

The outcome is read from what passed through the driver: a `CancelledError` carrying
this scope's message was thrown into the operation (delivered), and the operation then
raised it (cancelled: correct), returned (swallowed) or raised something else (replaced).
An operation that yields fewer than N times completes without meeting the cancellation;
raising N until that happens covers every checkpoint of the path.
"""

from __future__ import annotations

import enum
import time
import types
from collections.abc import Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio

T = TypeVar("T")

_OURS = "corral checkpoint campaign"


class Outcome(enum.StrEnum):
    COMPLETED = "completed"
    """Fewer checkpoints than N: the cancellation was never requested."""
    CANCELLED = "cancelled"
    """Requested and delivered, and the operation raised it."""
    UNDELIVERED = "returned under a shield"
    """Requested, but the operation returned without another unshielded checkpoint."""
    SWALLOWED = "swallowed the cancellation"
    REPLACED = "raised another error instead of the cancellation"
    FAILED = "failed before the cancellation"


#: Outcomes that are a defect of the operation.
DEFECTS = frozenset({Outcome.SWALLOWED, Outcome.REPLACED, Outcome.FAILED})


@dataclass(frozen=True)
class Attempt:
    n: int
    checkpoints: int
    outcome: Outcome
    landed: str = ""
    """Where the operation was suspended when the cancellation was requested."""
    present: frozenset[str] = frozenset()
    """What `observe` saw when the cancellation was requested."""
    error: str = ""
    returned_after_s: float = 0.0
    """How long the operation went on after the cancellation was requested."""


class _Counted(Generic[T]):
    def __init__(
        self,
        coro: Coroutine[Any, Any, T],
        n: int,
        scope: anyio.CancelScope,
        observe: Callable[[], frozenset[str]] | None,
    ) -> None:
        self.coro = coro
        self.n = n
        self.scope = scope
        self.observe = observe
        self.checkpoints = 0
        self.landed = ""
        self.present: frozenset[str] = frozenset()
        self.requested_at: float | None = None
        self.delivered = False

    def __await__(self) -> Generator[Any, Any, T]:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                yielded = self.coro.send(value) if error is None else self.coro.throw(error)
            except StopIteration as stop:
                result: T = stop.value
                return result
            self.checkpoints += 1
            if self.checkpoints == self.n:
                self.landed = where(self.coro)
                self.present = _observed(self.observe)
                self.requested_at = time.monotonic()
                self.scope.cancel(_OURS)
            try:
                value, error = (yield yielded), None
            except GeneratorExit:
                self.coro.close()
                raise
            except BaseException as exc:  # forwarded into the operation, as yield from does
                value, error = None, exc
                self.delivered = self.delivered or _is_ours(exc)


def _observed(observe: Callable[[], frozenset[str]] | None) -> frozenset[str]:
    if observe is None:
        return frozenset()
    try:
        return observe()
    except Exception as exc:  # the attempt goes on: the operation is what is under test
        return frozenset({f"observe failed: {exc!r}"})


def _is_ours(exc: BaseException) -> bool:
    return isinstance(exc, anyio.get_cancelled_exc_class()) and any(
        isinstance(arg, str) and arg.endswith(_OURS) for arg in exc.args
    )


def where(coro: Coroutine[Any, Any, Any]) -> str:
    """The chain of corral's own frames `coro` is suspended in, outermost first (the
    thread-call plumbing of `core.blocking` left out)."""
    frames: list[str] = []
    awaited: Any = coro
    while awaited is not None:
        frame: types.FrameType | None = getattr(awaited, "cr_frame", None) or getattr(
            awaited, "gi_frame", None
        )
        module = "" if frame is None else str(frame.f_globals.get("__name__", ""))
        if frame is not None and module.startswith("corral.") and module != "corral.core.blocking":
            frames.append(f"{module.rsplit('.', 1)[-1]}.{frame.f_code.co_name}:{frame.f_lineno}")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return " > ".join(frames)


async def cancel_at(
    n: int,
    operation: Callable[[], Coroutine[Any, Any, T]],
    observe: Callable[[], frozenset[str]] | None = None,
) -> tuple[Attempt, T | None]:
    """Run `operation()`, cancelling it at its `n`th checkpoint; the attempt and what the
    operation returned (None when it raised). `observe`, if given, is called on the event
    loop at the moment the cancellation is requested."""
    scope = anyio.CancelScope()
    counted = _Counted(operation(), n, scope, observe)
    result: T | None = None
    with scope:
        try:
            result = await counted
        except anyio.get_cancelled_exc_class() as exc:
            if not _is_ours(exc):
                raise
            return _attempt(counted, Outcome.CANCELLED), None
        except (Exception, BaseExceptionGroup) as exc:
            outcome = Outcome.REPLACED if counted.delivered else Outcome.FAILED
            return _attempt(counted, outcome, f"{type(exc).__name__}: {exc}"), None
    if counted.delivered:
        return _attempt(counted, Outcome.SWALLOWED), result
    if scope.cancel_called:
        return _attempt(counted, Outcome.UNDELIVERED), result
    return _attempt(counted, Outcome.COMPLETED), result


def _attempt(counted: _Counted[Any], outcome: Outcome, error: str = "") -> Attempt:
    requested = counted.requested_at
    return Attempt(
        counted.n,
        counted.checkpoints,
        outcome,
        counted.landed,
        counted.present,
        error,
        0.0 if requested is None else time.monotonic() - requested,
    )
