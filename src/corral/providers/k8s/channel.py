"""The exec channel on Kubernetes: the helper reached over one long-lived websocket exec.

The protocol, the bookkeeping of each call and the fallbacks are `corral.helper.channel`'s;
this module is the transport and the start. On the first exec corral streams its helper
(`corral.helper`, a static binary, in a tar) into the Pod's programs volume through the
probe container (corral's image and busybox; the sandbox has that volume read-only, see
`pod.PROGRAMS`), renamed into place whole, then starts it in the sandbox container from
there with one websocket exec with stdin. Each later command
is a frame on that websocket's stdin channel; the helper's frames come back on its stdout
channel, its own diagnostics on stderr, the stream's end status on the error channel.

Kubernetes cannot exec as another user, and neither does the helper here: it runs each
command as itself (the container's user, groups and environment, as a plain exec does).

The websocket is driven by one thread, the channel's reader, which both reads and writes:
an SSL socket must not be read and written from two threads at once (OpenSSL forbids it),
so a write from any other thread is queued and waits for that thread to flush it. The
connection is made by the kubernetes client (URL, credentials, subprotocol); the frames
after the handshake are read and written here, without its buffering.

Fallbacks (plain exec for the session's life, logged once): no binary for the node's
architecture, a copy that fails (a full volume), a helper that does not start or answer.
A connection to the API server that fails while the helper starts fails that call
(`ProviderError`), as it would fail a plain exec; the next call tries again.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import selectors
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any

import anyio
from anyio.lowlevel import EventLoopToken
from kubernetes.client.exceptions import ApiException
from kubernetes.stream.ws_client import ERROR_CHANNEL, STDERR_CHANNEL, STDOUT_CHANNEL
from websocket import ABNF

from corral.core.output import BoundedOutput
from corral.core.session import ExecRequest, ExecResult
from corral.errors import ProviderError
from corral.helper import helper_archive, helper_binary
from corral.helper.channel import Channel, Stateless
from corral.helper.channel import ChannelExecutor as _ChannelExecutor
from corral.helper.link import (
    DIAGNOSTICS,
    ChannelUnavailable,
    L,
    ProtocolError,
    Transport,
    greeted,
)
from corral.providers.k8s import probe
from corral.providers.k8s.api import call, explain
from corral.providers.k8s.execution import (
    FRAME,
    Target,
    connect,
    exit_code,
    kill,
    run_blocking_exec,
    run_exec,
)
from corral.providers.k8s.pod import PROGRAMS, PROGRAMS_RW

log = logging.getLogger("corral.k8s.channel")

#: bytes read from, or written to, the socket at once
IO_CHUNK = 64 * 1024
#: a websocket frame from the API server larger than this is garbage
MAX_WS_FRAME = 16 << 20
_STDIN = bytes([0])
# `head -c` bounds what tar reads: the v4 protocol cannot close stdin. Unpacked under a
# fresh name, then renamed over the helper: one running keeps its own file.
#: The same helper already there stays: a process manager running from it (another
#: harness's) is then still the program at that path, which its clients check.
_COPY = (
    'busybox head -c "$1" | busybox tar -x -f - -C "$2" && busybox chmod 555 "$2/$3" && '
    'if busybox cmp -s "$2/$3" "$2/$4"; then busybox rm -f "$2/$3"; '
    'else busybox mv -f "$2/$3" "$2/$4"; fi'
)
_HELPER = "corral-exec"
#: the helper as corral's probe container sees it (the programs volume, read-write there)
PROBE_HELPER = f"{PROGRAMS_RW}/{_HELPER}"


class PlainExecutor(Stateless):
    """One websocket exec through the API server per command."""

    def __init__(self, target: Target) -> None:
        self.target = target

    async def run(self, request: ExecRequest) -> ExecResult:
        return await run_exec(
            self.target,
            list(request.args),
            cwd=request.cwd,
            env=request.env,
            stdin=request.stdin,
            timeout=request.timeout,
            on_output=request.on_output,
            output_limit=request.output_limit,
        )


class WebSocketTransport:
    """The exec websocket after its handshake, driven by the thread that calls `recv`."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self._sock: socket.socket = ws.sock.sock
        self._sock.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._selector.register(self._sock, selectors.EVENT_READ)
        self._cond = threading.Condition()
        self._outgoing = bytearray()
        self._queued = 0  # bytes ever queued
        self._sent = 0  # bytes ever written to the socket
        self._shut = False
        self._failed: str | None = None
        self._ended = False
        self._incoming = bytearray()
        self._continued: int | None = None  # the channel of a fragmented message
        self._stderr = bytearray()
        self._status = bytearray()

    # -- any thread --------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        frames = b"".join(
            ABNF.create_frame(_STDIN + data[i : i + FRAME], ABNF.OPCODE_BINARY).format()
            for i in range(0, len(data), FRAME)
        )
        with self._cond:
            if self._shut or self._failed is not None:
                raise OSError(f"the exec stream is {self._failed or 'shut'}")
            self._outgoing += frames
            self._queued += len(frames)
            target = self._queued
        self._wake()
        with self._cond:
            while self._sent < target and not self._shut and self._failed is None:
                self._cond.wait()
            if self._sent < target:
                raise OSError(f"the exec stream is {self._failed or 'shut'}")

    def shutdown(self) -> None:
        with self._cond:
            self._shut = True
            self._cond.notify_all()
        self._wake()

    def diagnostics(self) -> str:
        parts = [
            self._stderr.decode(errors="replace").strip(),
            self._status.decode(errors="replace").strip(),
        ]
        return "; ".join(p for p in parts if p)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    # -- the reader thread only -----------------------------------------------------------------

    def recv(self) -> bytes:
        while True:
            with self._cond:
                if self._shut or self._ended:
                    return b""
                pending = bytes(self._outgoing[:IO_CHUNK])
            wrote = 0
            if pending:
                # Retried with the same leading bytes, as OpenSSL requires after a WANT.
                with contextlib.suppress(
                    BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError
                ):
                    wrote = self._sock.send(pending)
                if wrote:
                    with self._cond:
                        del self._outgoing[:wrote]
                        self._sent += wrote
                        self._cond.notify_all()
            data: bytes | None = None
            with contextlib.suppress(BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                data = self._sock.recv(IO_CHUNK)
            if data == b"":
                return b""
            if data is not None:
                stdout = self._parse(data)
                if stdout:
                    return stdout
                continue
            if wrote:
                continue
            self._wait()

    def _wait(self) -> None:
        with self._cond:
            writing = bool(self._outgoing)
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if writing else 0)
        self._selector.modify(self._sock, events)
        for key, _ in self._selector.select():
            if key.fileobj is self._wake_r:
                with contextlib.suppress(BlockingIOError):
                    while self._wake_r.recv(4096):
                        pass

    def _queue(self, frame: bytes) -> None:
        with self._cond:
            self._outgoing += frame
            self._queued += len(frame)

    def _parse(self, data: bytes) -> bytes:
        """The stdout bytes among the websocket frames `data` completes."""
        self._incoming += data
        stdout = bytearray()
        buffer = self._incoming
        while len(buffer) >= 2:
            fin, opcode = buffer[0] & 0x80, buffer[0] & 0x0F
            size, start = buffer[1] & 0x7F, 2
            if size == 126:
                if len(buffer) < 4:
                    break
                size, start = int.from_bytes(buffer[2:4], "big"), 4
            elif size == 127:
                if len(buffer) < 10:
                    break
                size, start = int.from_bytes(buffer[2:10], "big"), 10
            masked = buffer[1] & 0x80
            if size > MAX_WS_FRAME:
                raise ProtocolError(f"a websocket frame of {size} bytes")
            end = start + (4 if masked else 0) + size
            if len(buffer) < end:
                break
            payload = bytes(buffer[end - size : end])
            if masked:
                payload = ABNF.mask(bytes(buffer[start : start + 4]), payload)
            del buffer[:end]
            if opcode == ABNF.OPCODE_PING:
                self._queue(ABNF.create_frame(payload, ABNF.OPCODE_PONG).format())
            elif opcode == ABNF.OPCODE_CLOSE:
                self._ended = True
                break
            elif opcode in (ABNF.OPCODE_TEXT, ABNF.OPCODE_BINARY) and payload:
                channel, body = payload[0], payload[1:]
                self._continued = None if fin else channel
                self._route(channel, body, stdout)
            elif opcode == ABNF.OPCODE_CONT and self._continued is not None:
                channel = self._continued
                if fin:
                    self._continued = None
                self._route(channel, payload, stdout)
        return bytes(stdout)

    def _route(self, channel: int, body: bytes, stdout: bytearray) -> None:
        if channel == STDOUT_CHANNEL:
            stdout += body
        elif channel == STDERR_CHANNEL and len(self._stderr) < DIAGNOSTICS:
            self._stderr += body[: DIAGNOSTICS - len(self._stderr)]
        elif channel == ERROR_CHANNEL and len(self._status) < DIAGNOSTICS:
            self._status += body[: DIAGNOSTICS - len(self._status)]

    def close(self) -> None:
        with self._cond:
            if self._failed is None:
                self._failed = "closed"
            self._cond.notify_all()
        self._selector.close()
        for sock in (self._sock, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                sock.close()


class ChannelExecutor(_ChannelExecutor):
    """Execs through a helper in the sandbox container; plain websocket exec where it
    cannot."""

    def __init__(self, target: Target, sandbox_id: str) -> None:
        self.target = target
        self.plain: PlainExecutor = PlainExecutor(target)
        super().__init__(self.plain, sandbox_id, log)
        self._installed = False

    async def run(self, request: ExecRequest) -> ExecResult:
        try:
            return await super().run(request)
        except ProviderError as exc:
            if type(exc) is not ProviderError or not str(exc).startswith("the exec channel"):
                raise
            raise ProviderError(f"exec in Pod {self.target.pod}: {exc}") from None

    def _placement(self, request: ExecRequest) -> tuple[str | None, str]:
        # As the helper itself (the container's user); "" is the container's working dir.
        return None, request.cwd or ""

    async def _kill_fallback(self, marker: str, user: str | None) -> None:
        with anyio.move_on_after(10):
            await kill(self.target, marker)

    async def _arch(self) -> str:
        """The node's architecture, from the API server; from `uname -m` in the container
        where corral may not read Nodes."""
        target = self.target
        try:
            pod: Any = await call(
                target.tokens, target.clients.core.read_namespaced_pod, target.pod, target.namespace
            )
            node: Any = await call(target.tokens, target.clients.core.read_node, pod.spec.node_name)
            return str(node.status.node_info.architecture)
        except (ApiException, ProviderError, AttributeError):
            found = await self.plain.run(ExecRequest(("uname", "-m"), timeout=30))
            return found.stdout.strip()

    async def _copy(self, binary: Any) -> None:
        incoming = f".incoming-{secrets.token_hex(8)}"
        archive = await anyio.to_thread.run_sync(helper_archive, binary, incoming)
        stderr = BoundedOutput(4096)
        target = self.target
        # A lost connection raises ProviderError: this call fails, the next tries again.
        status, _ = await call(
            target.tokens,
            run_blocking_exec,
            target.sibling(probe.CONTAINER),
            ["sh", "-c", _COPY, "sh", str(len(archive)), PROGRAMS_RW, incoming, _HELPER],
            [archive],
            None,
            lambda stream, data: stderr.feed(data) if stream == "stderr" else None,
        )
        try:
            code = exit_code(status)
        except ProviderError as exc:  # the exec itself failed in the Pod
            raise ChannelUnavailable(
                f"copying the helper into the programs volume failed: {exc}"
            ) from None
        if code != 0:
            raise ChannelUnavailable(
                f"copying the helper into the programs volume failed (exit {code}): "
                f"{stderr.text().strip()[:300]}"
            )

    async def installed(self) -> str:
        """The path of corral's helper in the sandbox (the read-only programs volume),
        copied there once; ChannelUnavailable where this corral has none for the node."""
        if not self._installed:
            arch = await self._arch()
            binary = helper_binary(arch)
            if binary is None:
                raise ChannelUnavailable(
                    f"this corral has no helper binary for linux/{arch or '?'} "
                    "(build it with helper/build.sh)"
                )
            await self._copy(binary)
            self._installed = True
        return f"{PROGRAMS}/{_HELPER}"

    async def _start(self, token: EventLoopToken) -> Channel:
        path = await self.installed()
        return await start_program(
            self.target,
            [path, path, "1"],
            lambda transport: Channel(transport, token, "k8s", self.target.tokens, self.sandbox_id),
        )


async def start_program(target: Target, argv: list[str], link: Callable[[Transport], L]) -> L:
    """One of corral's programs in the sandbox container over one websocket exec, once it
    said hello. Refused or lost, the API server fails this call as it would a plain exec
    (a ProviderError); ChannelUnavailable (having cleaned up) if it does not answer."""
    try:
        ws = await call(target.tokens, connect, target, argv, stdin=True)
    except ApiException as exc:
        raise ProviderError(f"exec in Pod {target.pod} failed: {explain(exc)}") from None
    return await greeted(link(WebSocketTransport(ws)))
