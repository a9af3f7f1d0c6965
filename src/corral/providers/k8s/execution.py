"""Exec over the API server's exec websocket (v5 channel protocol, binary frames).

The websocket is driven in one worker thread: stdin goes out in frames of at most 1 MiB
and is closed through the v5 CLOSE signal; stdout/stderr are read until the stream
closes (draining, so large output is never cut short); the exit code comes from the
status channel. The command runs with `CORRAL_EXEC=<marker>` in its environment so that a
timeout can kill its whole tree inside the Pod.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import anyio
import anyio.from_thread
from kubernetes.stream.ws_client import ERROR_CHANNEL, STDERR_CHANNEL, STDOUT_CHANNEL

from corral.core.capture import Capture
from corral.core.markers import MARKER, kill_tree_argv, new_marker
from corral.core.session import (
    TIMEOUT_RETURNCODE,
    ExecRequest,
    ExecResult,
    Stream,
    emit,
)
from corral.errors import ProviderError
from corral.helper.link import ProtocolError
from corral.providers.k8s.api import TRANSPORT_ERRORS, Api, call, stoppable
from corral.providers.k8s.websocket import EXEC, WebSocketTransport

#: bytes of stdin queued ahead of the socket at most (one chunk more may be)
STDIN_AHEAD = 4 * 1024 * 1024
#: seconds a kill of a marked tree may run before corral stops waiting for it
KILL_S = 10.0
#: seconds between looks at the deadline and the stop event while no frame arrives
POLL_S = 0.2
_CHANNELS: dict[int, Stream] = {STDOUT_CHANNEL: "stdout", STDERR_CHANNEL: "stderr"}

Sink = Callable[[Stream, bytes], None]


#: The program `$1` looked up on $PATH and exec'd with the rest of the arguments, by a
#: busybox shell that would otherwise prefer its own applets to the image's programs.
EXEC_ON_PATH = (
    "case $1 in */*) p=$1 ;; *) p=; IFS=:; "
    'for d in $PATH; do [ -f "$d/$1" ] && [ -x "$d/$1" ] && { p=$d/$1; break; }; done; '
    'unset IFS ;; esac; [ -n "$p" ] || { echo "$1: not found" >&2; exit 127; }; '
    'shift; exec "$p" "$@"'
)
# $1 cwd, $2 how many NAME=value follow; then the command.
_RUN = (
    'cd "$1" && { n=$2; shift 2; while [ "$n" -gt 0 ]; do export "$1"; shift; '
    "n=$((n - 1)); done; " + EXEC_ON_PATH + "; }"
)
# busybox's shell counts itself in SHLVL (the image's `sh` may not): undone, so that the
# command sees the container's environment as a plain exec would.
_UNDO_SHLVL = (
    'SHLVL=$((${SHLVL:-1} - 1)); if [ "$SHLVL" -gt 0 ]; then export SHLVL; else unset SHLVL; fi; '
)


class Target:
    """Where execs go: one container of one Pod.

    `shell`: what runs corral's wrapper and kill scripts there: corral's busybox shell
    from the programs volume in the sandbox container, the image's `sh` elsewhere.
    """

    def __init__(
        self,
        clients: Api,
        namespace: str,
        pod: str,
        container: str,
        shell: tuple[str, ...] = ("sh",),
    ) -> None:
        self.clients = clients
        self.namespace = namespace
        self.pod = pod
        self.container = container
        self.shell = shell

    @property
    def tokens(self) -> int:
        """The clients' limit on blocking calls at once."""
        return int(self.clients.tokens)

    def sibling(self, container: str) -> Target:
        """Another container of the same Pod (its own image's `sh`)."""
        return Target(self.clients, self.namespace, self.pod, container)


def wrapped(
    args: list[str], cwd: str | None, env: Mapping[str, str], marker: str, shell: tuple[str, ...]
) -> list[str]:
    """`args` run in `cwd` with `env` and the tree marker (the exec API has neither)."""
    assignments = [f"{MARKER}={marker}", *(f"{k}={v}" for k, v in env.items())]
    script = _RUN if shell == ("sh",) else _UNDO_SHLVL + _RUN
    return [*shell, "-c", script, "sh", cwd or ".", str(len(assignments)), *assignments, *args]


def exit_code(status: str) -> int | None:
    """The exit code from the status channel's JSON."""
    if not status:
        return None
    try:
        parsed: dict[str, Any] = json.loads(status)
    except ValueError:
        return None
    if parsed.get("status") == "Success":
        return 0
    details: dict[str, Any] = parsed.get("details") or {}
    causes: list[dict[str, Any]] = details.get("causes") or []
    for cause in causes:
        if cause.get("reason") == "ExitCode":
            return int(cause.get("message", "1"))
    raise ProviderError(f"exec failed in the Pod: {parsed.get('message', status)}")


def connect(target: Target, argv: list[str], *, stdin: bool) -> WebSocketTransport:
    """The exec websocket of `argv` in `target`, its handshake done and nothing read yet
    (blocking); ProviderError if the API server refuses it or does not answer."""
    ws = target.clients.websocket(
        "connect_get_namespaced_pod_exec",
        target.pod,
        target.namespace,
        container=target.container,
        command=argv,
        stdin=stdin,
        stdout=True,
        stderr=True,
        tty=False,
        _preload_content=False,
        binary=True,
    )
    return WebSocketTransport(ws, EXEC)


class ExecStream:
    """One exec, driven in the calling thread; iterating yields (stream, bytes) as they
    arrive, after which `status` holds the status channel's JSON.

    stdin is written between reads, never ahead of them: a command that prints before it
    reads gets its stdin, and the deadline and `stop` are looked at every POLL_S."""

    def __init__(
        self,
        target: Target,
        argv: list[str],
        stdin: Iterable[bytes] | None = None,
        deadline: float | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.target = target
        self.argv = argv
        self.stdin = stdin
        self.deadline = deadline
        self.stop = stop or threading.Event()
        self.status: str = ""
        self.timed_out = False

    def __iter__(self) -> Iterator[tuple[Stream, bytes]]:
        transport = connect(self.target, self.argv, stdin=self.stdin is not None)
        status: bytes = b""
        ended = False
        try:
            for channel, data in self._frames(transport):
                name = _CHANNELS.get(channel)
                if name is not None:
                    yield name, data
                elif channel == ERROR_CHANNEL:
                    status += data
            ended = not (self.timed_out or self.stop.is_set())
        except (ProtocolError, *TRANSPORT_ERRORS) as exc:
            raise ProviderError(
                f"exec in Pod {self.target.pod}: the connection to the API server was lost "
                f"({type(exc).__name__}: {exc})"
            ) from None
        finally:
            transport.close()
            self.status = status.decode("utf-8", errors="replace")
        if ended and not status:
            # The API server always sends the exit status before it closes the stream.
            raise ProviderError(
                f"exec in Pod {self.target.pod}: the stream closed before the command's exit "
                "status arrived (the API server or the Pod went away)"
            )

    def _frames(self, transport: WebSocketTransport) -> Iterator[tuple[int, bytes]]:
        """(channel, payload) of each data frame until the server closes the stream, the
        deadline passes or `stop` is set; stdin queued a few chunks ahead of the socket.
        Read from the websocket itself: the client's `update()`/`read_channel()` loop
        loses bytes of large outputs (50 MB trees came back short) and copies every byte
        into a buffer it never empties."""
        chunks = None if self.stdin is None else iter(self.stdin)
        while True:
            if self.stop.is_set():
                return
            if self.deadline is not None and time.monotonic() > self.deadline:
                self.timed_out = True
                return
            while chunks is not None and transport.backlog() < STDIN_AHEAD:
                chunk = next(chunks, None)
                if chunk is None:
                    transport.queue_close()
                    chunks = None
                else:
                    transport.queue(chunk)
            frames = transport.exchange(POLL_S)
            if frames is None:
                return
            yield from frames


def run_blocking_exec(
    target: Target,
    argv: list[str],
    stdin: Iterable[bytes] | None,
    deadline: float | None,
    sink: Sink,
    stop: threading.Event | None = None,
) -> tuple[str, bool]:
    """Drive one exec in this thread until it ends, its deadline passes or `stop` is set;
    returns (status JSON, timed out)."""
    execution = ExecStream(target, argv, stdin, deadline, stop)
    for name, data in execution:
        sink(name, data)
    return execution.status, execution.timed_out


async def run_own(
    target: Target,
    argv: Iterable[str],
    *,
    stdin: bytes | None = None,
    timeout: float | None = 30,
    output_limit: int = 64 * 1024,
) -> ExecResult:
    """A command of corral's own (the workload gate, a probe, a file call's check): one
    websocket exec with a bounded wait, never through the exec channel, whose helper the
    workload controls."""
    request = ExecRequest(tuple(argv), stdin=stdin, timeout=timeout, output_limit=output_limit)
    return await run_exec(target, request)


async def run_exec(target: Target, request: ExecRequest) -> ExecResult:
    """`request` in `target` (its user is the container's: the exec API has no other)."""
    marker = new_marker()
    on_output, stdin, timeout = request.on_output, request.stdin, request.timeout
    capture = Capture(request.output_limit, on_output)

    def sink(name: Stream, data: bytes) -> None:
        text = capture.feed(name, data)
        if on_output is not None:
            anyio.from_thread.run(emit, on_output, name, text)

    deadline = None if timeout is None else capture.started + timeout
    finished = False
    try:
        # A cancelled exec returns within one websocket poll (0.2 s), then its tree is
        # killed in the Pod: the remote command never outlives the call.
        status, timed_out = await stoppable(
            target.tokens,
            functools.partial(
                run_blocking_exec,
                target,
                wrapped(list(request.args), request.cwd, request.env, marker, target.shell),
                None if stdin is None else [stdin],
                deadline,
                sink,
            ),
        )
        finished = True
    finally:
        if not finished:
            with anyio.CancelScope(shield=True):
                await kill(target, marker)
    if timed_out:
        await kill(target, marker)
    await capture.finish()
    return capture.result(
        TIMEOUT_RETURNCODE if timed_out else exit_code(status), timed_out=timed_out
    )


async def kill(target: Target, marker: str) -> None:
    """Kill every process in the Pod carrying `marker`; given up after KILL_S once its
    exec runs (a cancel scope cannot stop the worker thread that drives it)."""
    with contextlib.suppress(ProviderError):  # the Pod is gone, and the tree with it
        await call(
            target.tokens,
            run_blocking_exec,
            target,
            kill_tree_argv(marker, target.shell),
            None,
            time.monotonic() + KILL_S,
            _ignore,
        )


def _ignore(name: Stream, data: bytes) -> None:
    del name, data
