"""The denied-egress reader: corral's helper in the *holder*, bound to the NFLOG group the
rules log every refusal to (see `corral.network.events` and `helper/nflog.go`).

The holder owns the sandbox's network namespace and alone has NET_ADMIN there, which
binding (or writing to) a log group needs; its filesystem and processes are not the
sandbox's. So nothing the workload does, root included, can forge, hide or erase an
event: all it can do is be refused, which is what an event records.

The reader is one long-lived exec; its stdout is read off the event loop by a thread
that feeds the session's bounded `EventLog` (no loop needed: the log has its own lock).
A reader that cannot start leaves the session without events, logged once, and
`network_events()` raises `FeatureUnsupported` with the reason; one that dies later
keeps what it read, and the snapshot's `error` says when and why it stopped.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import threading
from dataclasses import dataclass
from typing import Any

import anyio
from docker.errors import APIError

from corral.core.logs import event
from corral.errors import ProviderError
from corral.helper import helper_archive, helper_binary, no_helper
from corral.network.events import NFLOG_GROUP, EventLog
from corral.providers.docker.engine import Engine, Hijacked

log = logging.getLogger("corral.docker.events")

HELLO_TIMEOUT_S = 10.0
CLOSE_WAIT_S = 5.0


@dataclass(frozen=True)
class EventFeed:
    """A session's events: the bounded log, and the reader feeding it or why there is none."""

    log: EventLog
    reader: EventReader | None
    unavailable: str | None


class EventsUnavailable(Exception):
    """The reader could not be started; the message says why."""


def demux(buffer: bytearray) -> tuple[bytes, bytes]:
    """Take the complete engine stream frames off `buffer`: (stdout, stderr) bytes."""
    out, err = bytearray(), bytearray()
    while len(buffer) >= 8:
        size = int.from_bytes(buffer[4:8], "big")
        if len(buffer) < 8 + size:
            break
        stream = buffer[0]
        (out if stream == 1 else err).extend(buffer[8 : 8 + size])
        del buffer[: 8 + size]
    return bytes(out), bytes(err)


class EventReader:
    """One reader in one holder, feeding `log`. Made by `start_reader`."""

    def __init__(self, stream: Hijacked, events: EventLog, session_id: str) -> None:
        self._hijacked = stream
        self.sock: socket.socket = self._hijacked.sock
        self._buffered: Any = self._hijacked.reader
        self.events = events
        self.session_id = session_id
        self.closed = False
        self.hello = threading.Event()
        self._diagnostics = bytearray()
        self._thread = threading.Thread(
            target=self._read_loop, name=f"corral-network-events-{session_id}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def _recv(self) -> bytes:
        if self._buffered is not None:
            return self._buffered.read1(65536)
        return self.sock.recv(65536)

    def _read_loop(self) -> None:
        reason = "the reader's stream ended"
        frames = bytearray()
        try:
            while True:
                data = self._recv()
                if not data:
                    break
                frames += data
                out, err = demux(frames)
                if err and len(self._diagnostics) < 1024:
                    self._diagnostics += err[: 1024 - len(self._diagnostics)]
                if out:
                    if not self.hello.is_set() and out.startswith(b"H 1\n"):
                        self.hello.set()
                    self.events.feed(out)
                if len(frames) > 1 << 20:
                    reason = "the reader's stream carried an oversized frame"
                    break
        except (OSError, ValueError) as exc:
            reason = f"the reader's stream failed: {exc}"
        finally:
            self._hijacked.close()
        if not self.closed:
            said = self._diagnostics.decode(errors="replace").strip()
            self.events.stopped(f"{reason}: {said}" if said else reason)
            if self.hello.is_set():  # a reader that never started is reported by its start
                event(
                    log,
                    "warning",
                    "network events stopped",
                    sandbox=self.session_id,
                    reason=self.events.error,
                )
        self.hello.set()

    async def aclose(self) -> None:
        """Shut the stream (the reader exits when its stdin ends) and join the thread."""
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        await anyio.to_thread.run_sync(self._thread.join, CLOSE_WAIT_S)


async def start_reader(
    engine: Engine, holder: str, events: EventLog, session_id: str
) -> EventReader:
    """Copy corral's helper into the holder, start it as the NFLOG reader, wait until it
    has bound the group. Raises `EventsUnavailable`."""
    try:
        version: dict[str, Any] = await engine.call(engine.api.version)
        arch = str(version.get("Arch", ""))
        binary = helper_binary(arch)
        if binary is None:
            raise EventsUnavailable(no_helper(arch))
        path = f"/.corral-events-{secrets.token_hex(8)}"
        archive = await anyio.to_thread.run_sync(helper_archive, binary, path[1:])
        await engine.call(engine.api.put_archive, holder, "/", archive)
        stream = await engine.open_stream(holder, [path, "--nflog", path, str(NFLOG_GROUP)])
    except (APIError, ProviderError) as exc:
        raise EventsUnavailable(f"starting the reader in the holder failed: {exc}") from None
    reader = EventReader(stream, events, session_id)
    reader.start()
    try:
        started = await anyio.to_thread.run_sync(
            reader.hello.wait, HELLO_TIMEOUT_S, abandon_on_cancel=True
        )
    except BaseException:
        await _shielded_close(reader)
        raise
    if not started:
        await _shielded_close(reader)
        raise EventsUnavailable(f"the reader did not start in {HELLO_TIMEOUT_S:.0f} s")
    if events.error is not None:
        error = events.error
        await _shielded_close(reader)
        raise EventsUnavailable(error)
    return reader


async def _shielded_close(reader: EventReader) -> None:
    with anyio.CancelScope(shield=True):
        await reader.aclose()
