"""Bounded head+tail capture of a stream, and incremental UTF-8 decoding for streaming."""

from __future__ import annotations

import codecs

DEFAULT_OUTPUT_LIMIT = 1024 * 1024


class BoundedOutput:
    """Keeps the first and last `limit // 2` bytes of a stream; never raises on bad UTF-8."""

    def __init__(self, limit: int = DEFAULT_OUTPUT_LIMIT) -> None:
        if limit < 2:
            raise ValueError(f"output limit {limit!r} must be at least 2 bytes")
        self._half = limit // 2
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self._half - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self._tail += chunk
            if len(self._tail) > self._half:
                del self._tail[: len(self._tail) - self._half]

    @property
    def truncated(self) -> bool:
        return self.total > len(self._head) + len(self._tail)

    def text(self) -> str:
        if not self.truncated:
            return (bytes(self._head) + bytes(self._tail)).decode("utf-8", errors="replace")
        dropped = self.total - len(self._head) - len(self._tail)
        head = bytes(self._head).decode("utf-8", errors="replace")
        tail = bytes(self._tail).decode("utf-8", errors="replace")
        return f"{head}\n[... {dropped} bytes truncated by corral ...]\n{tail}"


class StreamDecoder:
    """Decodes chunks for `on_output` without splitting a multi-byte character."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def decode(self, chunk: bytes, *, final: bool = False) -> str:
        return self._decoder.decode(chunk, final)
