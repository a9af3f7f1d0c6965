"""A persistent shell's status stream (fd 3) read as hostile: bounded per run, parsed in
one pass, and anything that is not a status line kills the shell with an error naming
the budget. The real shell runs in every provider's conformance suite and the escape
catalogue (`corral.testing.escapes`)."""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import asynccontextmanager

import pytest

from corral.core.processes import Item, PtySize, StartRequest
from corral.core.shell import STATUS_BUDGET, Shell, StatusLines, StatusViolation
from corral.errors import ProviderError

pytestmark = pytest.mark.anyio

CHUNK = 32 * 1024  # what the manager sends in one frame


class FakeManager:
    """A shell that answers each line's status on fd 3 after `before` (items it says
    first, pulled lazily, so that `pulled` counts what the shell read of them)."""

    def __init__(self) -> None:
        self.pending: list[Item] = []
        self.before: Iterator[Item] = iter(())
        self.pulled = 0
        self.killed = False

    async def start(self, request: StartRequest) -> str:
        return "e-1"

    @asynccontextmanager
    async def attach(self, id: str, offset: int) -> AsyncGenerator[AsyncIterator[Item]]:
        yield self._items()

    async def _items(self) -> AsyncIterator[Item]:
        while self.pending:
            for item in self.before:
                self.pulled += 1
                yield item
            yield self.pending.pop(0)

    async def write(self, id: str, data: bytes) -> None:
        token = re.search(rb"printf '([0-9a-f]{16}) ", data)
        assert token is not None
        self.pending.append(("status", token[1] + b" 0\n"))

    async def close_stdin(self, id: str) -> None: ...

    async def signal(self, id: str, signum: int, *, spare_leader: bool = False) -> None: ...

    async def kill(self, id: str) -> None:
        self.killed = True

    async def resize(self, id: str, size: PtySize) -> None: ...

    async def list(self) -> list[object]:
        return []


def _chunks(data: bytes, size: int = CHUNK) -> Iterator[Item]:
    return (("status", data[i : i + size]) for i in range(0, len(data), size))


async def _shell(manager: FakeManager) -> Shell:
    return await Shell.start(manager, StartRequest(("sh",)), 1 << 20)  # pyright: ignore[reportArgumentType]


@pytest.mark.parametrize("flood", [b"\n" * 1_000_000, b"x" * 1_000_000])
async def test_a_status_flood_kills_the_shell_after_its_budget_having_read_one_chunk(
    flood: bytes,
) -> None:
    manager = FakeManager()
    shell = await _shell(manager)
    manager.before = _chunks(flood)
    with pytest.raises(
        ProviderError, match="STATUS_BUDGET: 4096 bytes a run.*: over 4096 bytes in one run"
    ):
        await shell.run("echo hi")
    # The work is the budget's, not the flood's: one 32 KiB chunk of 31 was read.
    assert manager.pulled == 1 and manager.killed
    with pytest.raises(ProviderError, match="can run nothing more: .*STATUS_BUDGET"):
        await shell.run("echo again")


async def test_a_line_that_is_not_a_status_kills_the_shell() -> None:
    manager = FakeManager()
    shell = await _shell(manager)
    manager.before = _chunks(b"0123456789abcdef 0 forged\n")
    with pytest.raises(
        ProviderError, match="STATUS_BUDGET.*'0123456789abcdef 0 forged', not a status line"
    ):
        await shell.run("echo hi")
    assert manager.killed


async def test_statuses_within_the_budget_in_every_run_are_read_however_they_are_cut() -> None:
    manager = FakeManager()
    shell = await _shell(manager)
    stale = b"0123456789abcdef 1\n" * (STATUS_BUDGET // 20)  # nearly a budget's worth
    for _ in range(3):  # the budget is per run
        manager.before = _chunks(stale, 1)
        assert (await shell.run("true")).returncode == 0
    assert not manager.killed


def test_the_parser_scans_each_byte_once() -> None:
    """Bytes one at a time: `rfind` looks only at what is new, so a line costs its length."""
    scanned = 0

    class Counting(bytearray):
        def rfind(self, sub: bytes, start: int = 0, *_: int) -> int:  # pyright: ignore[reportIncompatibleMethodOverride]
            nonlocal scanned
            scanned += len(self) - start
            return super().rfind(sub, start)

    lines = StatusLines()
    lines._partial = Counting()  # pyright: ignore[reportPrivateUsage]
    said: list[tuple[str, int]] = []
    data = b"0123456789abcdef 7\n" * 200
    for byte in range(len(data)):
        said += lines.feed(data[byte : byte + 1])
        if byte % 2000 == 0:
            lines.next_run()
    assert said == [("0123456789abcdef", 7)] * 200
    assert scanned == len(data)
    with pytest.raises(StatusViolation, match="over 4096 bytes in one run"):
        lines.feed(b"\n" * (STATUS_BUDGET + 1))
