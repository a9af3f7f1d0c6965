"""What one exec printed: both streams bounded, decoded for streaming, and timed."""

from __future__ import annotations

import time

from corral.core.output import BoundedOutput, StreamDecoder
from corral.core.session import ExecResult, OutputCallback, Stream, emit


class Capture:
    def __init__(self, limit: int, on_output: OutputCallback | None) -> None:
        self.started = time.monotonic()
        self.on_output = on_output
        self._out: dict[Stream, BoundedOutput] = {
            "stdout": BoundedOutput(limit),
            "stderr": BoundedOutput(limit),
        }
        self._decoders: dict[Stream, StreamDecoder] = {
            "stdout": StreamDecoder(),
            "stderr": StreamDecoder(),
        }

    def feed(self, stream: Stream, chunk: bytes) -> str:
        """Keep `chunk`; return its text for `on_output` (never a split character)."""
        self._out[stream].feed(chunk)
        return self._decoders[stream].decode(chunk)

    async def emit(self, stream: Stream, chunk: bytes) -> None:
        if self.on_output is None:
            self._out[stream].feed(chunk)  # nothing streams: no text to decode
            return
        await emit(self.on_output, stream, self.feed(stream, chunk))

    async def finish(self) -> None:
        """Flush what the decoders held back, at the end of the streams."""
        for stream, decoder in self._decoders.items():
            await emit(self.on_output, stream, decoder.decode(b"", final=True))

    def result(self, returncode: int | None, *, timed_out: bool = False) -> ExecResult:
        return ExecResult(
            returncode=returncode,
            stdout=self._out["stdout"].text(),
            stderr=self._out["stderr"].text(),
            timed_out=timed_out,
            duration_s=time.monotonic() - self.started,
            stdout_truncated=self._out["stdout"].truncated,
            stderr_truncated=self._out["stderr"].truncated,
        )
