"""The exec channel: one helper per sandbox, reached over one long-lived exec stream.

Every engine exec pays the runtime's exec cost (tens of milliseconds). The channel pays
it once: corral copies its helper (`corral.helper`, a static binary) into the sandbox at
a fresh random path owned by root, starts it as root with one `exec_create(stdin=True)`
+ `exec_start(socket=True)`, and from then on sends each command as a frame; the helper
spawns it (argv, cwd, env, user, stdin) in its own session and streams stdout, stderr
and the exit code back, several commands at once, multiplexed by id.

Frames, both ways: `u32 length | u8 kind | u32 id | payload` (length counts kind, id and
payload). corral -> helper: `R` run (JSON), `I` stdin bytes, `C` end of stdin, `K` kill.
helper -> corral: `H` hello (JSON, id 0), `o`/`e` output, `X` exit (JSON), `F` refused
before anything ran. On the way back the engine wraps them in its own stream frames.

What corral decides never goes through here (probes, end_workload, archives): the helper
lives in the sandbox and the workload, root included, can kill or impersonate it. All it
could do is lie about the workload's own output, which the workload controls anyway. It
is read as hostile input: frames are bounded, and a malformed one breaks the channel.

Fallbacks, each logged: no binary for the engine's architecture, a helper that does not
start (an image it cannot run in, no room to copy it), or one without the capabilities to
switch users: plain exec for the session's life. A call the helper refuses (an unknown
user, a missing cwd or program): that call runs as a plain exec, which answers exactly as
the engine does. A channel that breaks mid-call: that call raises `ProviderError` and its
tree is killed through the plain path; the next call starts a fresh helper.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import secrets
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.lowlevel import EventLoopToken, current_token
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from docker.errors import APIError

from corral.core.blocking import run_blocking
from corral.core.capture import Capture
from corral.core.logs import event
from corral.core.markers import MARKER, new_marker
from corral.core.session import TIMEOUT_RETURNCODE, ExecRequest, ExecResult
from corral.errors import ProviderError
from corral.helper import helper_archive, helper_binary
from corral.providers.docker.engine import Engine, call
from corral.providers.docker.execution import kill_tree
from corral.providers.docker.executor import PlainExecutor

log = logging.getLogger("corral.docker.channel")

VERSION = 1
#: the largest frame either side sends is a 32 KiB chunk; anything far larger is garbage
MAX_FRAME = 1 << 20
STDIN_CHUNK = 64 * 1024
HELLO_TIMEOUT_S = 10.0
#: how long a kill waits for the helper to report the command gone
KILL_WAIT_S = 2.0
#: seconds `aclose` waits for the reader thread once the stream is shut
CLOSE_WAIT_S = 5.0
_HEADER = struct.Struct(">IBI")
_STREAM = {ord("o"): "stdout", ord("e"): "stderr"}


class ChannelUnavailable(Exception):
    """The helper could not be started here; the message says why."""


class ProtocolError(Exception):
    pass


def frame(kind: str, rid: int, payload: bytes = b"") -> bytes:
    return _HEADER.pack(5 + len(payload), ord(kind), rid) + payload


class FrameParser:
    """Helper frames out of the engine's multiplexed exec stream (stdout: the frames;
    stderr: the helper's own diagnostics, kept bounded for the logs)."""

    def __init__(self) -> None:
        self._engine = bytearray()
        self._frames = bytearray()
        self.diagnostics = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        self._engine += data
        while len(self._engine) >= 8:
            size = int.from_bytes(self._engine[4:8], "big")
            if len(self._engine) < 8 + size:
                break
            stream = self._engine[0]
            payload = bytes(self._engine[8 : 8 + size])
            del self._engine[: 8 + size]
            if stream == 1:
                self._frames += payload
            elif stream == 2 and len(self.diagnostics) < 2048:
                self.diagnostics += payload[: 2048 - len(self.diagnostics)]
            elif stream not in (0, 1, 2):
                raise ProtocolError(f"not an engine stream frame: {self.head()!r}")
        frames: list[tuple[int, int, bytes]] = []
        while len(self._frames) >= _HEADER.size:
            size, kind, rid = _HEADER.unpack_from(self._frames)
            if size < 5 or size > MAX_FRAME:
                raise ProtocolError(f"frame of {size} bytes: {self.head()!r}")
            if len(self._frames) < 4 + size:
                break
            frames.append((kind, rid, bytes(self._frames[_HEADER.size : 4 + size])))
            del self._frames[: 4 + size]
        return frames

    def head(self) -> bytes:
        return bytes((self._engine or self._frames)[:120])


Message = tuple[int, bytes]  # (kind, payload); kind 0: the channel broke (payload: why)


@dataclass(frozen=True)
class Refused:
    """The helper refused a call before anything ran: it goes to plain exec."""

    reason: str


class Channel:
    """One running helper and the stream to it. Made by `open_channel`."""

    def __init__(self, raw: Any, token: EventLoopToken, tokens: int, sandbox_id: str) -> None:
        self.raw = raw
        self.sock: socket.socket = getattr(raw, "_sock", raw)
        response = getattr(raw, "_response", None)
        # http.client's buffered reader: it may hold bytes read along with the headers.
        self._reader: Any = response.raw._fp.fp if response is not None else None
        self.token = token
        self.tokens = tokens
        self.dead: str | None = None
        self.hello: dict[str, Any] = {}
        self._ids = itertools.count(1)
        self._boxes: dict[int, MemoryObjectSendStream[Message]] = {}
        self._write_lock = threading.Lock()
        self._parser = FrameParser()
        self._thread: threading.Thread | None = None
        self.sandbox_id = sandbox_id

    # -- the reader thread: blocking reads, delivered to the loop in batches --------------

    def start_reader(self) -> None:
        self._thread = threading.Thread(
            # Named for its session, which it lives as long as (see testing.leftovers).
            target=self._read_loop,
            name=f"corral-exec-channel-{self.sandbox_id}",
            daemon=True,
        )
        self._thread.start()

    def _recv(self) -> bytes:
        if self._reader is not None:
            return self._reader.read1(65536)
        return self.sock.recv(65536)

    def _read_loop(self) -> None:
        reason = "the helper's stream ended"
        try:
            while True:
                data = self._recv()
                if not data:
                    break
                frames = self._parser.feed(data)
                if frames:
                    anyio.from_thread.run_sync(self._deliver, frames, token=self.token)
        except ProtocolError as exc:
            reason = f"the helper spoke nonsense ({exc})"
        except (OSError, ValueError) as exc:
            reason = f"the helper's stream failed: {exc}"
        except RuntimeError:
            return  # the event loop is gone, and every caller with it
        finally:
            with contextlib.suppress(OSError):
                self.sock.close()
        diagnostics = self._parser.diagnostics.decode(errors="replace").strip()
        if diagnostics:
            reason = f"{reason}: {diagnostics}"
        with contextlib.suppress(RuntimeError):
            anyio.from_thread.run_sync(self._broken, reason, token=self.token)

    def _deliver(self, frames: list[tuple[int, int, bytes]]) -> None:
        for kind, rid, payload in frames:
            box = self._boxes.get(rid)
            if box is not None:
                with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    box.send_nowait((kind, payload))

    def _broken(self, reason: str) -> None:
        if self.dead is None:
            self.dead = reason
        for box in self._boxes.values():
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                box.send_nowait((0, reason.encode()))

    def close(self) -> None:
        """Stop using this helper: its stream is shut, so it kills what it runs and exits;
        the reader thread sees the end and leaves. Never blocks."""
        if self.dead is None:
            self.dead = "closed"
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    async def join(self, timeout_s: float) -> None:
        """Wait (off the loop, which the reader may still need once) for the reader thread
        to leave after `close`."""
        thread = self._thread
        if thread is not None:
            await anyio.to_thread.run_sync(thread.join, timeout_s)

    # -- the event loop side ---------------------------------------------------------------

    def _open_box(self, rid: int) -> MemoryObjectReceiveStream[Message]:
        send, receive = anyio.create_memory_object_stream[Message](math.inf)
        self._boxes[rid] = send
        return receive

    def _close_box(self, rid: int, receive: MemoryObjectReceiveStream[Message]) -> None:
        box = self._boxes.pop(rid, None)
        if box is not None:
            box.close()
        receive.close()

    async def _write(self, data: bytes) -> None:
        def send() -> None:
            with self._write_lock:
                self.sock.sendall(data)

        try:
            await run_blocking("docker", self.tokens, send)
        except OSError as exc:
            self.close()
            raise ProviderError(f"the exec channel broke: {exc}") from None

    async def await_hello(self) -> None:
        receive = self._open_box(0)
        try:
            with anyio.fail_after(HELLO_TIMEOUT_S):
                kind, payload = await receive.receive()
        except TimeoutError:
            raise ChannelUnavailable("the helper did not answer") from None
        finally:
            self._close_box(0, receive)
        if kind != ord("H"):
            raise ChannelUnavailable(payload.decode(errors="replace") or "no hello")
        try:
            hello = json.loads(payload)
        except ValueError:
            raise ChannelUnavailable(f"a malformed hello: {payload[:120]!r}") from None
        if not isinstance(hello, dict) or hello.get("version") != VERSION:  # pyright: ignore[reportUnknownMemberType]
            raise ChannelUnavailable(f"a helper of another version: {payload[:120]!r}")
        self.hello = dict(hello)  # pyright: ignore[reportUnknownArgumentType]

    async def run(
        self,
        request: ExecRequest,
        *,
        user: str,
        cwd: str,
        kill_fallback: Callable[[str, str], Any],
    ) -> ExecResult | Refused:
        if self.dead is not None:
            raise ProviderError(f"the exec channel broke: {self.dead}")
        rid = next(self._ids)
        marker = new_marker()
        spec = {
            "argv": request.args,
            "cwd": cwd,
            "env": [f"{k}={v}" for k, v in {**request.env, MARKER: marker}.items()],
            "user": user,
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
        receive = self._open_box(rid)
        finished = False
        try:
            await self._write(b"".join(message))
            with anyio.move_on_after(request.timeout):
                outcome = await self._collect(receive, capture)
                finished = True
                return outcome
            return capture.result(TIMEOUT_RETURNCODE, timed_out=True)
        finally:
            if not finished:
                # A timeout, a cancellation or a broken stream: end the tree, bounded.
                with anyio.CancelScope(shield=True):
                    await self._kill(rid, receive, marker, user, kill_fallback)
            self._close_box(rid, receive)

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
        user: str,
        kill_fallback: Callable[[str, str], Any],
    ) -> None:
        confirmed = False
        if self.dead is None:
            with contextlib.suppress(ProviderError):
                await self._write(frame("K", rid))
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
    """Execs through a helper in the sandbox; plain exec where the helper cannot serve."""

    def __init__(self, api: Engine, tokens: int, container: str, sandbox_id: str) -> None:
        self.api = api
        self.tokens = tokens
        self.container = container
        self.sandbox_id = sandbox_id
        self.plain = PlainExecutor(api, tokens, container)
        self.channel: Channel | None = None
        self.unavailable: str | None = None
        self.starts = 0
        self._lock = anyio.Lock()
        self._default_user = ""
        self._default_cwd = "/"

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
        outcome = await channel.run(
            request,
            user=request.user or self._default_user,
            cwd=request.cwd or self._default_cwd,
            kill_fallback=self._kill_fallback,
        )
        if isinstance(outcome, Refused):
            log.debug("exec channel refused a call (%s); plain exec", outcome.reason)
            return await self.plain.run(request)
        return outcome

    async def _kill_fallback(self, marker: str, user: str) -> None:
        with anyio.move_on_after(10):
            await kill_tree(self.api, self.tokens, self.container, marker, user or None)

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
                    log,
                    "warning",
                    "exec channel unavailable; using plain exec",
                    sandbox=self.sandbox_id,
                    reason=self.unavailable,
                )
                return None
            return self.channel

    async def _start(self, token: EventLoopToken) -> Channel:
        try:
            version: dict[str, Any] = await call(self.tokens, self.api.version)
            arch = str(version.get("Arch", ""))
            binary = helper_binary(arch)
            if binary is None:
                raise ChannelUnavailable(
                    f"this corral has no helper binary for linux/{arch or '?'} "
                    "(build it with helper/build.sh)"
                )
            info: dict[str, Any] = await call(
                self.tokens, self.api.inspect_container, self.container
            )
            config: dict[str, Any] = info.get("Config") or {}
            env: list[str] = config.get("Env") or []
            home = any(entry.startswith("HOME=") for entry in env)
            self._default_user = str(config.get("User") or "")
            self._default_cwd = str(config.get("WorkingDir") or "/")
            path = f"/.corral-exec-{secrets.token_hex(8)}"
            archive = await anyio.to_thread.run_sync(helper_archive, binary, path[1:])
            await call(self.tokens, self.api.put_archive, self.container, "/", archive)
            created: dict[str, Any] = await call(
                self.tokens,
                self.api.exec_create,
                self.container,
                [path, path, "1" if home else "0"],
                stdin=True,
                stdout=True,
                stderr=True,
                user="0",
                workdir="/",
            )
            raw: Any = await call(self.tokens, self.api.exec_start, created["Id"], socket=True)
        except (APIError, ProviderError) as exc:
            raise ChannelUnavailable(f"starting the helper failed: {exc}") from None
        channel = Channel(raw, token, self.tokens, self.sandbox_id)
        channel.start_reader()
        try:
            await channel.await_hello()
            if not channel.hello.get("can_switch_user"):
                raise ChannelUnavailable("the helper lacks CAP_SETUID/CAP_SETGID")
        except BaseException as exc:
            channel.close()
            # Best effort: a helper that never ran never removed its copy. Not after a
            # cancellation, which must return at once (the copy goes with the sandbox).
            if isinstance(exc, Exception):
                with anyio.move_on_after(10), contextlib.suppress(ProviderError):
                    await self.plain.run(ExecRequest(("rm", "-f", path), user="0", timeout=5))
            if isinstance(exc, ChannelUnavailable) and channel.dead not in (None, "closed"):
                raise ChannelUnavailable(f"{exc}: {channel.dead}") from None
            raise
        self.starts += 1
        event(log, "info", "exec channel started", sandbox=self.sandbox_id, start=self.starts)
        return channel
