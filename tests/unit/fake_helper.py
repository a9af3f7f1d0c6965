"""A stand-in for one of corral's programs in the sandbox, for unit tests of the links to
them (`corral.helper.link`): a `Transport` whose far side answers each frame."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from corral.helper.link import FrameParser, frame

Reply = Callable[[int, int, bytes], list[bytes]]


class FakeHelper:
    """A `Transport` whose far side is `reply(kind, id, payload) -> frames`."""

    def __init__(self, reply: Reply, hello: bytes = b'{"version": 1}') -> None:
        self.reply = reply
        self.out: queue.Queue[bytes] = queue.Queue()
        self.out.put(frame("H", 0, hello))
        self.parser = FrameParser()
        self.sent: list[tuple[int, int, bytes]] = []
        self.closed = threading.Event()

    def recv(self) -> bytes:
        return self.out.get()

    def send(self, data: bytes) -> None:
        if self.closed.is_set():
            raise OSError("shut")
        for kind, rid, payload in self.parser.feed(data):
            self.sent.append((kind, rid, payload))
            for reply in self.reply(kind, rid, payload):
                self.out.put(reply)

    def shutdown(self) -> None:
        self.closed.set()
        self.out.put(b"")

    def close(self) -> None:
        pass

    def diagnostics(self) -> str:
        return "fake stderr"

    def die(self) -> None:
        self.out.put(b"")
