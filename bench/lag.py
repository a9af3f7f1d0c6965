"""Event-loop lag, and the same measure taken by a separate idle process as its control.

`LagMonitor` is a ticker task on the loop under test: blocking calls on the loop show up
as ticks that wake late. `HostLag` runs the same 5 ms ticker in a separate process that
does nothing else, so what it sees is the host's scheduling delay alone (a loaded 2-core
machine delays every process); a loop lag well above it is corral's.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
import traceback
from collections import Counter
from types import FrameType, TracebackType

import anyio
from anyio.abc import Process

TICK_S = 0.005
#: a loop this late is in a stall, and a sampler thread notes where in the code it is
STALL_S = 0.1
SAMPLE_S = 0.02

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
    """The worst tick delay on the loop, the longest pause of the garbage collector while
    it ran (`gc.callbacks`: a collection on the loop's thread holds the loop for all of it,
    and one of the whole heap grows with every live session), and where the loop's thread
    was, sampled every 20 ms, while a tick was more than 100 ms late."""

    def __init__(self) -> None:
        self.worst_s = 0.0
        #: the longest collection: its wall time, its thread's CPU time, on the loop or not
        self.gc_worst_s = self.gc_worst_cpu_s = 0.0
        self.gc_worst_on_loop = False
        #: where the loop's thread was in stalls: sample counts by code location
        self.stalls: Counter[str] = Counter()
        self._loop_thread = 0
        self._gc_started = (0.0, 0.0)
        self._due = time.monotonic()

    async def run(self) -> None:
        """Tick until cancelled, keeping the worst delay past each tick's deadline."""
        self._loop_thread = threading.get_ident()
        stop = threading.Event()
        sampler = threading.Thread(target=self._sample, args=(stop,), daemon=True)
        gc.callbacks.append(self._gc)
        sampler.start()
        try:
            while True:
                self._due = time.monotonic() + TICK_S
                await anyio.sleep(TICK_S)
                self.worst_s = max(self.worst_s, time.monotonic() - self._due)
        finally:
            stop.set()
            gc.callbacks.remove(self._gc)

    def stall_note(self, top: int = 3) -> str:
        """The code the loop was most often in while it stalled, in words."""
        total = sum(self.stalls.values())
        if not total:
            return f"no stall over {STALL_S * 1000:.0f} ms sampled"
        places = ", ".join(f"{where} ({n})" for where, n in self.stalls.most_common(top))
        return f"in stalls over {STALL_S * 1000:.0f} ms the loop was in {places} of {total} samples"

    def _sample(self, stop: threading.Event) -> None:
        while not stop.wait(SAMPLE_S):
            if time.monotonic() - self._due < STALL_S:
                continue
            frame = sys._current_frames().get(self._loop_thread)  # pyright: ignore[reportPrivateUsage]
            if frame is not None:
                self.stalls[_where(frame)] += 1

    def gc_note(self) -> str:
        """The longest collection, in words."""
        where = "on the loop's thread" if self.gc_worst_on_loop else "in another thread"
        return (
            f"the longest garbage collection, {where}, took {self.gc_worst_s * 1000:.0f} ms "
            f"({self.gc_worst_cpu_s * 1000:.0f} ms of it its own CPU)"
        )

    def _gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = (time.perf_counter(), time.thread_time())
            return
        took = time.perf_counter() - self._gc_started[0]
        if took > self.gc_worst_s:
            self.gc_worst_s = took
            self.gc_worst_cpu_s = time.thread_time() - self._gc_started[1]
            self.gc_worst_on_loop = threading.get_ident() == self._loop_thread


def _where(frame: FrameType) -> str:
    """The innermost frame in corral's package, and the innermost of all."""
    stack = traceback.extract_stack(frame)
    own = next((f for f in reversed(stack) if "/corral/" in f.filename), None)
    inner = stack[-1]
    words = [f"{inner.filename.rsplit('/', 2)[-1]}:{inner.lineno} {inner.name}"]
    if own is not None and own is not inner:
        words.insert(0, f"{own.filename.rsplit('/corral/', 1)[-1]}:{own.lineno} {own.name}")
    return " > ".join(words)


def full_collection_s() -> float:
    """How long one full collection of this process's heap takes now."""
    started = time.perf_counter()
    gc.collect()
    return time.perf_counter() - started


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
