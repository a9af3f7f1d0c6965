"""Event-loop lag, and the same measure taken by a separate idle process as its control.

`LagMonitor` is a ticker task on the loop under test: blocking calls on the loop show up
as ticks that wake late. `HostLag` runs the same 5 ms ticker in a separate process that
does nothing else, so what it sees is the host's scheduling delay alone (a loaded 2-core
machine delays every process); a loop lag well above it is corral's.
"""

from __future__ import annotations

import sys
from types import TracebackType

import anyio
from anyio.abc import Process

TICK_S = 0.005

_CHILD = """
import select, sys, time
worst = 0.0
while True:
    due = time.monotonic() + 0.005
    if select.select([sys.stdin], [], [], 0.005)[0]:
        break
    worst = max(worst, time.monotonic() - due)
print(worst, flush=True)
"""


class LagMonitor:
    def __init__(self) -> None:
        self.worst_s = 0.0

    async def run(self) -> None:
        """Tick until cancelled, keeping the worst delay past each tick's deadline."""
        while True:
            due = anyio.current_time() + TICK_S
            await anyio.sleep(TICK_S)
            self.worst_s = max(self.worst_s, anyio.current_time() - due)


class HostLag:
    """The worst tick delay of a separate idle process while the block runs."""

    def __init__(self) -> None:
        self.worst_s = 0.0
        self._process: Process | None = None

    async def __aenter__(self) -> HostLag:
        self._process = await anyio.open_process([sys.executable, "-c", _CHILD])
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        process = self._process
        assert process is not None and process.stdin is not None and process.stdout is not None
        async with process:
            await process.stdin.aclose()
            self.worst_s = float((await process.stdout.receive()).decode())
