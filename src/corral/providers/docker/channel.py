"""The exec channel on Docker: the helper reached over one hijacked engine exec stream.

The protocol, the bookkeeping of each call and the fallbacks are `corral.helper.channel`'s;
this module is the transport and the start. corral starts its helper from the session's
read-only programs volume (`programs.HELPER`, filled through the holder) as root with one
`exec_create(stdin=True)` + `exec_start(socket=True)`, and reads the helper's frames out
of the engine's multiplexed stream (8-byte headers: stdout carries the frames, stderr the
helper's own diagnostics).

Docker-only fallback: a helper without the capabilities to switch users (plain exec for
the session's life, since every user the engine can exec as must be reachable).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
from anyio.lowlevel import EventLoopToken
from docker.errors import APIError

from corral.core.session import ExecRequest
from corral.errors import ProviderError
from corral.helper import no_helper
from corral.helper.channel import Channel, PlainExecutor
from corral.helper.channel import ChannelExecutor as _ChannelExecutor
from corral.helper.link import (
    DIAGNOSTICS,
    ChannelUnavailable,
    L,
    ProtocolError,
    Transport,
    greeted,
)
from corral.providers.docker import programs
from corral.providers.docker.engine import Engine, Hijacked
from corral.providers.docker.execution import kill_tree, run_exec

log = logging.getLogger("corral.docker.channel")
#: the most one read of the stream takes: all that arrived while the reader was handing
#: the last read to the event loop, so that a large output crosses in a few passes
RECV_BYTES = 1 << 20


class EngineStream:
    """The engine's multiplexed exec stream (`u8 stream | 3 pad | u32 size | payload`):
    stdout payloads handed on, stderr kept bounded for the logs."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.diagnostics = bytearray()

    def feed(self, data: bytes) -> bytes:
        self._buffer += data
        stdout = bytearray()
        while len(self._buffer) >= 8:
            size = int.from_bytes(self._buffer[4:8], "big")
            if len(self._buffer) < 8 + size:
                break
            stream = self._buffer[0]
            payload = self._buffer[8 : 8 + size]
            if stream == 1:
                stdout += payload
            elif stream == 2 and len(self.diagnostics) < DIAGNOSTICS:
                self.diagnostics += payload[: DIAGNOSTICS - len(self.diagnostics)]
            elif stream not in (0, 1, 2):
                raise ProtocolError(f"not an engine stream frame: {bytes(self._buffer[:120])!r}")
            del self._buffer[: 8 + size]
        return bytes(stdout)


class SocketTransport:
    """The hijacked exec socket (`exec_start(socket=True)`)."""

    def __init__(self, stream: Hijacked) -> None:
        self._hijacked = stream
        self.sock: socket.socket = self._hijacked.sock
        self._reader: Any = self._hijacked.reader
        self._write_lock = threading.Lock()
        self._stream = EngineStream()

    def recv(self) -> bytes:
        while True:
            if self._reader is not None:
                data: bytes = self._reader.read1(RECV_BYTES)
            else:
                data = self.sock.recv(RECV_BYTES)
            if not data:
                return b""
            stdout = self._stream.feed(data)
            if stdout:
                return stdout

    def send(self, data: bytes) -> None:
        with self._write_lock:
            self.sock.sendall(data)

    def shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._hijacked.close()

    def diagnostics(self) -> str:
        return self._stream.diagnostics.decode(errors="replace").strip()


@dataclass(frozen=True)
class Defaults:
    """What an engine exec into the container gets when the call does not say."""

    user: str
    cwd: str
    #: the HOME of the container's config, if it sets one
    home: str | None


async def container_defaults(engine: Engine, container: str) -> Defaults:
    """The container's exec defaults; ChannelUnavailable where this corral has no helper
    for the engine's architecture (or the engine does not answer)."""
    try:
        version: dict[str, Any] = await engine.call(engine.api.version)
        arch = str(version.get("Arch", ""))
        if programs.helper(arch) is None:
            raise ChannelUnavailable(no_helper(arch))
        info: dict[str, Any] = await engine.call(engine.api.inspect_container, container)
    except (APIError, ProviderError) as exc:
        raise ChannelUnavailable(f"starting the helper failed: {exc}") from None
    config: dict[str, Any] = info.get("Config") or {}
    env: list[str] = config.get("Env") or []
    home = next((e.partition("=")[2] for e in env if e.startswith("HOME=")), None)
    return Defaults(str(config.get("User") or ""), str(config.get("WorkingDir") or "/"), home)


async def start_program(
    engine: Engine, container: str, argv: list[str], link: Callable[[Transport], L]
) -> L:
    """One of corral's programs in `container` as root, from the read-only copy the
    session's holder filled (nothing in the sandbox can write or replace it:
    `corral.providers.docker.programs`), over one engine exec stream; once it said hello.
    ChannelUnavailable (having cleaned up) when it cannot start or answer."""
    try:
        stream = await engine.open_stream(container, argv)
    except (APIError, ProviderError) as exc:
        raise ChannelUnavailable(f"starting {argv[0]} failed: {exc}") from None
    return await greeted(link(SocketTransport(stream)))


class ChannelExecutor(_ChannelExecutor):
    """Execs through a helper in the sandbox container; plain engine exec where it cannot."""

    def __init__(self, engine: Engine, container: str, sandbox_id: str) -> None:
        self.engine = engine
        self.container = container
        self.plain = PlainExecutor(
            functools.partial(run_exec, engine, container, shell=programs.SHELL)
        )
        super().__init__(self.plain, sandbox_id, log)
        self._default_user = ""
        self._default_cwd = "/"

    def _placement(self, request: ExecRequest) -> tuple[str | None, str]:
        return request.user or self._default_user, request.cwd or self._default_cwd

    async def _kill_fallback(self, marker: str, user: str | None) -> None:
        with anyio.move_on_after(10):
            await kill_tree(self.engine, self.container, marker, user or None, programs.SHELL)

    async def _start(self, token: EventLoopToken) -> Channel:
        defaults = await container_defaults(self.engine, self.container)
        self._default_user, self._default_cwd = defaults.user, defaults.cwd
        channel = await start_program(
            self.engine,
            self.container,
            [programs.HELPER, programs.HELPER, "1" if defaults.home is not None else "0"],
            lambda transport: Channel(
                transport, token, "docker", self.engine.tokens, self.sandbox_id
            ),
        )
        if not channel.hello.get("can_switch_user"):
            channel.close()
            raise ChannelUnavailable("the helper lacks CAP_SETUID/CAP_SETGID")
        return channel
