"""The exec channel's protocol, shared by the providers: one helper per sandbox, reached
over one long-lived exec stream, each command a frame.

Every exec through a provider's API (an engine exec, an API server websocket) pays that
API's exec cost. The channel pays it once: the provider copies corral's helper
(`corral.helper`, a static binary) into the sandbox at a fresh random path, starts it over
one exec stream with stdin, and from then on sends each command as a frame; the helper
spawns it (argv, cwd, env, user, stdin) in its own session and streams stdout, stderr and
the exit code back, several commands at once, multiplexed by id.

Frames, both ways: `u32 length | u8 kind | u32 id | payload` (length counts kind, id and
payload). corral -> helper: `R` run (JSON), `I` stdin bytes, `C` end of stdin, `K` kill.
helper -> corral: `H` hello (JSON, id 0), `o`/`e` output, `X` exit (JSON), `F` refused
before anything ran.

This module knows nothing of how the frames travel: a provider gives `Channel` a
`Transport` (Docker: the engine's hijacked exec socket and its 8-byte stream headers;
Kubernetes: the exec websocket and its channel byte) and a `ChannelExecutor` subclass
that starts the helper its way.

What corral decides never goes through here (probes, end_workload, archives): the helper
lives in the sandbox and the workload can kill or impersonate it. All it could do is lie
about the workload's own output, which the workload controls anyway. It is read as
hostile input: frames are bounded, and a malformed one breaks the channel.

Fallbacks, each logged by the provider: no binary for the sandbox's architecture, a helper
that does not start (an image it cannot run in, no room to copy it): plain exec for the
session's life. A call the helper refuses (an unknown user, a missing cwd or program):
that call runs as a plain exec, which answers exactly as the provider's API does. A
channel that breaks mid-call: that call raises `ProviderError` and its tree is killed
through the plain path; the next call starts a fresh helper.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import anyio
from anyio.lowlevel import EventLoopToken, current_token
from anyio.streams.memory import MemoryObjectReceiveStream

from corral.core.capture import Capture
from corral.core.logs import event
from corral.core.markers import MARKER, new_marker
from corral.core.session import TIMEOUT_RETURNCODE, ExecRequest, ExecResult
from corral.errors import ProviderError
from corral.helper.link import ChannelUnavailable, FrameLink, Message, frame

VERSION = 1
STDIN_CHUNK = 64 * 1024
#: how long a kill waits for the helper to report the command gone
KILL_WAIT_S = 2.0
#: seconds `aclose` waits for the reader thread once the stream is shut
CLOSE_WAIT_S = 5.0
_STREAM = {ord("o"): "stdout", ord("e"): "stderr"}


class Executor(Protocol):
    """How a session runs a command in its sandbox: the plain per-command exec of its
    provider, or a `ChannelExecutor` that falls back to it."""

    async def run(self, request: ExecRequest) -> ExecResult:
        """Run `request` under the session contract (`EnvironmentSession.exec`); its `cwd`
        is absolute or None (the container's working directory), its `user` a name, an id
        or None (the container's user)."""
        ...

    def reset(self) -> None:
        """The sandbox's processes are gone (its workload was ended): forget any that this
        executor keeps there. Never blocks."""
        ...

    async def aclose(self) -> None:
        """The session is closing: stop what this executor runs on the harness's side
        (threads, streams), bounded."""
        ...


class PlainExecutor:
    """A provider's plain per-command exec (`run`: Docker's engine exec, Kubernetes's
    websocket exec) as an `Executor`. It keeps nothing in the sandbox or on the harness's
    side: nothing to reset, nothing to close."""

    def __init__(self, run: Callable[[ExecRequest], Awaitable[ExecResult]]) -> None:
        self._run = run

    async def run(self, request: ExecRequest) -> ExecResult:
        return await self._run(request)

    def reset(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


@dataclass(frozen=True)
class Refused:
    """The helper refused a call before anything ran: it goes to plain exec."""

    reason: str


class KillFallback(Protocol):
    async def __call__(self, marker: str, user: str | None) -> None:
        """Kill the tree carrying `marker` through the plain path, bounded."""
        ...


class Channel(FrameLink):
    """One running exec helper and the stream to it."""

    version = VERSION
    streamed = frozenset(_STREAM)

    async def run(
        self,
        request: ExecRequest,
        *,
        user: str | None,
        cwd: str,
        kill_fallback: KillFallback,
    ) -> ExecResult | Refused:
        """`request` through the helper. `user` None: as the helper itself (no switch);
        `cwd` "": the helper's own working directory."""
        if self.dead is not None:
            raise ProviderError(f"the exec channel broke: {self.dead}")
        rid = next(self.ids)
        marker = new_marker()
        spec = {
            "argv": request.args,
            "cwd": cwd,
            "env": [f"{k}={v}" for k, v in {**request.env, MARKER: marker}.items()],
            "user": user or "",
            "as_self": user is None,
            "stdin": request.stdin is not None,
            "marker": marker,
        }
        message = [frame("R", rid, json.dumps(spec).encode())]
        if request.stdin is not None:
            data = request.stdin
            message += [
                frame("I", rid, data[i : i + STDIN_CHUNK]) for i in range(0, len(data), STDIN_CHUNK)
            ]
            message.append(frame("C", rid))
        capture = Capture(request.output_limit, request.on_output)
        receive = self.open_box(rid)
        self.keep(rid, 2 * request.output_limit)  # head and tail of stdout and stderr
        finished = False
        try:
            # The timeout counts from the call: a stdin the stream takes slowly is in it.
            with anyio.move_on_after(request.timeout):
                await self.write(b"".join(message))
                outcome = await self._collect(receive, capture)
                finished = True
                return outcome
            return capture.result(TIMEOUT_RETURNCODE, timed_out=True)
        finally:
            if not finished:
                # A timeout, a cancellation or a broken stream: end the tree, bounded.
                with anyio.CancelScope(shield=True):
                    await self._kill(rid, receive, marker, user, kill_fallback)
            self.close_box(rid, receive)

    async def _collect(
        self, receive: MemoryObjectReceiveStream[Message], capture: Capture
    ) -> ExecResult | Refused:
        async for kind, payload in receive:
            stream = _STREAM.get(kind)
            if stream is not None:
                await capture.emit(stream, payload)  # pyright: ignore[reportArgumentType]
            elif kind == ord("X"):
                await capture.finish()
                return capture.result(_exit_code(payload))
            elif kind == ord("F"):
                return Refused(payload.decode(errors="replace"))
            elif kind == 0:
                raise ProviderError(f"the exec channel broke: {payload.decode()}")
        raise ProviderError("the exec channel broke: its mailbox closed")

    async def _kill(
        self,
        rid: int,
        receive: MemoryObjectReceiveStream[Message],
        marker: str,
        user: str | None,
        kill_fallback: KillFallback,
    ) -> None:
        confirmed = False
        if self.dead is None:
            with contextlib.suppress(ProviderError):
                await self.write(frame("K", rid))
                with anyio.move_on_after(KILL_WAIT_S):
                    async for kind, _ in receive:
                        if kind in (ord("X"), ord("F"), 0):
                            confirmed = kind != 0
                            break
        if not confirmed:
            # The helper is gone or stuck: the tree is found by its marker from outside,
            # and this helper is not trusted with another call.
            self.close()
            await kill_fallback(marker, user)


def _exit_code(payload: bytes) -> int:
    try:
        exit_info = json.loads(payload)
        code = exit_info["code"]
    except (ValueError, KeyError, TypeError):
        raise ProviderError(
            f"the exec channel broke: a malformed exit: {payload[:120]!r}"
        ) from None
    if not isinstance(code, int) or isinstance(code, bool):
        raise ProviderError(f"the exec channel broke: exit code {code!r}")
    return code


class ChannelExecutor:
    """Execs through a helper in the sandbox; the provider's plain exec where the helper
    cannot serve. A provider subclasses it with how to start the helper (`_start`), where
    a request lands (`_placement`) and how to kill a tree without it (`_kill_fallback`)."""

    def __init__(self, plain: Executor, sandbox_id: str, log: logging.Logger) -> None:
        self.plain = plain
        self.sandbox_id = sandbox_id
        self.log = log
        self.channel: Channel | None = None
        self.unavailable: str | None = None
        self.starts = 0
        self._lock = anyio.Lock()

    def reset(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    async def aclose(self) -> None:
        channel, self.channel = self.channel, None
        if channel is not None:
            channel.close()
            await channel.join(CLOSE_WAIT_S)

    async def run(self, request: ExecRequest) -> ExecResult:
        channel = await self._channel()
        if channel is None:
            return await self.plain.run(request)
        user, cwd = self._placement(request)
        outcome = await channel.run(request, user=user, cwd=cwd, kill_fallback=self._kill_fallback)
        if isinstance(outcome, Refused):
            self.log.debug("exec channel refused a call (%s); plain exec", outcome.reason)
            return await self.plain.run(request)
        return outcome

    def _placement(self, request: ExecRequest) -> tuple[str | None, str]:
        """The helper's (user, cwd) for `request` (see `Channel.run`)."""
        raise NotImplementedError

    async def _kill_fallback(self, marker: str, user: str | None) -> None:
        raise NotImplementedError

    async def _start(self, token: EventLoopToken) -> Channel:
        """A running helper that said hello, or ChannelUnavailable (having cleaned up)."""
        raise NotImplementedError

    async def _channel(self) -> Channel | None:
        async with self._lock:
            if self.unavailable is not None:
                return None
            token = current_token()
            current = self.channel
            if current is not None and current.dead is None and current.token == token:
                return current
            if current is not None:
                current.close()
                self.channel = None
            try:
                self.channel = await self._start(token)
            except ChannelUnavailable as exc:
                self.unavailable = str(exc)
                event(
                    self.log,
                    "warning",
                    "exec channel unavailable; using plain exec",
                    sandbox=self.sandbox_id,
                    reason=self.unavailable,
                )
                return None
            self.starts += 1
            event(
                self.log, "info", "exec channel started", sandbox=self.sandbox_id, start=self.starts
            )
            return self.channel
