"""Exec through the Engine API: a hijacked socket read on the event loop, frames demuxed.

Every exec carries a unique `CORRAL_EXEC` marker in its environment, which its whole
process tree inherits; on timeout or cancellation corral kills, inside the sandbox, every
process that carries the marker, so nothing the command started outlives it.
"""

from __future__ import annotations

import socket
import ssl
from typing import Any

import anyio
from docker.errors import APIError, NotFound

from corral.core.capture import Capture
from corral.core.markers import MARKER, kill_tree_argv, new_marker
from corral.core.session import TIMEOUT_RETURNCODE, ExecRequest, ExecResult, Stream
from corral.errors import ProviderError
from corral.providers.docker.engine import Engine, Hijacked

_STREAMS: dict[int, Stream] = {1: "stdout", 2: "stderr"}


async def run_own(
    engine: Engine,
    container: str,
    argv: list[str],
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
) -> ExecResult:
    """A control command of corral's own (a policy apply, a probe, a resolver query), as
    root, by one engine exec with a bounded wait: never through the exec channel, whose
    helper the workload controls."""
    request = ExecRequest(tuple(argv), env=env or {}, user="0", timeout=60, stdin=stdin)
    return await run_exec(engine, container, request)


async def run_exec(
    engine: Engine, container: str, request: ExecRequest, shell: tuple[str, ...] = ("sh",)
) -> ExecResult:
    """`request` in `container`, its cwd as the engine takes it (absolute, or None: the
    container's); a timed-out or cancelled command's tree is killed by `shell` (see
    `kill_tree`)."""
    capture = Capture(request.output_limit, request.on_output)
    marker = new_marker()
    stdin, user = request.stdin, request.user
    try:
        exec_id, stream = await engine.exec_stream(
            container,
            list(request.args),
            stdin=stdin is not None,
            user=user or "",
            workdir=request.cwd,
            environment={**request.env, MARKER: marker},
        )
    except NotFound as exc:
        raise ProviderError(f"sandbox container {container[:12]} is gone: {exc}") from None
    except APIError as exc:
        raise ProviderError(f"exec in {container[:12]} failed: {exc}") from None
    sock = stream.sock
    timed_out = False
    finished = False
    try:
        if not isinstance(sock, ssl.SSLSocket):
            sock.setblocking(False)
        with anyio.move_on_after(request.timeout) as scope:
            async with anyio.create_task_group() as tg:
                if stdin is not None:
                    tg.start_soon(_send_stdin, sock, stdin)
                await _read_frames(stream, capture)
        timed_out = scope.cancelled_caught
        finished = not timed_out
    finally:
        with anyio.CancelScope(shield=True):
            stream.close()
            if not finished:
                await kill_tree(engine, container, marker, user, shell)
    returncode = TIMEOUT_RETURNCODE if timed_out else await _exit_code(engine, exec_id)
    return capture.result(returncode, timed_out=timed_out)


async def kill_tree(
    engine: Engine,
    container: str,
    marker: str,
    user: str | None,
    shell: tuple[str, ...],
) -> None:
    """Kill every process in the sandbox whose environment carries `marker`, by `shell`:
    corral's busybox in the sandbox container (`programs`), the image's `sh` in a service.

    Runs as the command's own user: root in the sandbox holds neither CAP_SYS_PTRACE (to
    read another user's /proc/PID/environ) nor, on engines before 23.0 in a sandbox whose
    configured user is not root, CAP_KILL.
    """
    try:
        created: dict[str, Any] = await engine.call(
            engine.api.exec_create, container, kill_tree_argv(marker, shell), user=user or ""
        )
        await engine.call(engine.api.exec_start, created["Id"])
    except APIError:
        pass  # the container is gone, and the tree with it


async def _exit_code(engine: Engine, exec_id: str) -> int | None:
    # The stream can close a moment before the engine records the exit.
    for _ in range(50):
        try:
            info: dict[str, Any] = await engine.idempotent(engine.api.exec_inspect, exec_id)
        except APIError as exc:
            raise ProviderError(f"exec {exec_id[:12]}: exec_inspect failed: {exc}") from None
        if not info.get("Running") and info.get("ExitCode") is not None:
            return int(info["ExitCode"])
        await anyio.sleep(0.02)
    raise ProviderError(f"exec {exec_id[:12]} never reported an exit code")


async def _send_stdin(sock: socket.socket, data: bytes) -> None:
    if isinstance(sock, ssl.SSLSocket):

        def send() -> None:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)

        await anyio.to_thread.run_sync(send)
        return
    view = memoryview(data)
    while view:
        await anyio.wait_writable(sock)
        try:
            view = view[sock.send(view) :]
        except BlockingIOError:
            continue
    sock.shutdown(socket.SHUT_WR)


async def _recv(sock: socket.socket) -> bytes:
    if isinstance(sock, ssl.SSLSocket):
        return await anyio.to_thread.run_sync(sock.recv, 65536, abandon_on_cancel=True)
    while True:
        await anyio.wait_readable(sock)
        try:
            return sock.recv(65536)
        except BlockingIOError:
            continue


async def _read_ahead(stream: Hijacked) -> bytes:
    """The bytes the HTTP reader took off the socket together with the response headers.

    An exec the engine refuses before it starts (an unknown user) has its message written
    right behind the headers; it can sit in http.client's buffer rather than the socket.
    """
    reader = stream.reader
    if reader is None:
        return b""
    if isinstance(stream.sock, ssl.SSLSocket):
        return await anyio.to_thread.run_sync(reader.read1, 65536, abandon_on_cancel=True)
    return reader.read1(65536)  # the socket is non-blocking: buffered bytes, or what is there


async def _read_frames(hijacked: Hijacked, capture: Capture) -> None:
    sock = hijacked.sock
    buffer = bytearray(await _read_ahead(hijacked))
    while True:
        while len(buffer) >= 8:
            size = int.from_bytes(buffer[4:8], "big")
            if len(buffer) < 8 + size:
                break
            stream = _STREAMS.get(buffer[0])
            payload = bytes(buffer[8 : 8 + size])
            del buffer[: 8 + size]
            if stream is None:
                continue
            await capture.emit(stream, payload)
        chunk = await _recv(sock)
        if not chunk:
            break
        buffer += chunk
    await capture.finish()
