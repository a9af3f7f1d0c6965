"""The process manager's client (`corral.helper.procs`) against a fake manager: ids, the
window it gives back, a cancelled start, refusals, and ids the sandbox's end took. The
real manager runs in every provider's conformance suite (`corral.testing.processes`)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import anyio
import anyio.to_thread
import pytest
from anyio.lowlevel import EventLoopToken, current_token

from corral.core.blocking import limiter
from corral.core.processes import KILLED, Gap, ProcessExited, PtySize, StartRequest
from corral.errors import ConfigError, ProcessNotFound, ProviderError, RemotePathNotFound
from corral.helper.link import Pace, frame
from corral.helper.procs import GAPS_IN_A_ROW, WINDOW, ProcessClient, ProcessLink
from tests.unit.fake_helper import FakeHelper

pytestmark = pytest.mark.anyio

HELLO = b'{"version": 2, "epoch": "e1"}'


def _place(request: StartRequest) -> dict[str, Any]:
    return {"argv": list(request.args), "cwd": "", "env": [], "user": "", "as_self": True}


def _client(manager: FakeHelper) -> ProcessClient:
    async def connect(token: EventLoopToken) -> ProcessLink:
        link = ProcessLink(manager, current_token(), "unit", 4, "sid")
        link.start_reader()
        await link.await_hello()
        return link

    return ProcessClient(connect, _place, sandbox_id="sid")


def _json(payload: bytes) -> Any:
    return json.loads(payload)


def _starts(kind: int, rid: int, payload: bytes) -> list[bytes]:
    if kind == ord("S"):
        if _json(payload)["argv"][0] == "missing":
            return [frame("F", rid, b'{"kind": "program", "message": "missing: not found"}')]
        return [frame("Y", rid, b'{"proc": 7, "pid": 100}')]
    if kind in (ord("K"), ord("G")):
        return [frame("Y", rid)]
    return []


async def test_a_started_process_is_named_by_the_managers_epoch_and_carries_a_marker() -> None:
    manager = FakeHelper(_starts, HELLO)
    client = _client(manager)
    assert await client.start(StartRequest(("sleep", "1"), name="n")) == "e1-7"
    (spec,) = [_json(p) for k, _, p in manager.sent if k == ord("S")]
    assert spec["name"] == "n" and spec["argv"] == ["sleep", "1"]
    assert any(e.startswith("CORRAL_EXEC=") for e in spec["env"]), "the tree can be found"
    with pytest.raises(RemotePathNotFound, match="missing"):
        await client.start(StartRequest(("missing",)))
    with pytest.raises(ProcessNotFound, match="not a process id"):
        await client.kill("nonsense")
    with pytest.raises(ProcessNotFound, match="manager that is gone"):
        await client.signal("e0-7", 2)
    await client.aclose()


async def test_a_start_cancelled_before_its_answer_kills_what_started() -> None:
    held: list[int] = []

    def late(kind: int, rid: int, payload: bytes) -> list[bytes]:
        if kind == ord("S"):
            held.append(rid)  # answered only after the caller gave up
            return []
        return _starts(kind, rid, payload)

    manager = FakeHelper(late, HELLO)
    client = _client(manager)
    async with anyio.create_task_group() as tg:

        async def cancelled_start() -> None:
            with anyio.move_on_after(0.05):
                await client.start(StartRequest(("sleep", "300")))

        tg.start_soon(cancelled_start)
        await anyio.sleep(0.1)
        manager.out.put(frame("Y", held[0], b'{"proc": 3, "pid": 9}'))
    kills = [_json(p) for k, _, p in manager.sent if k == ord("K")]
    assert kills == [{"proc": 3}], "the process the cancelled start made was killed"
    await client.aclose()


async def test_a_start_cancelled_before_its_request_went_out_returns_at_once() -> None:
    # Nothing was sent, so no answer will come: waiting START_REPLY_S (10 s) for one was
    # what the local cancellation campaign found ("ran on 10.0 s after the cancellation").
    manager = FakeHelper(_starts, HELLO)
    client = _client(manager)
    await client.start(StartRequest(("true",)))  # connected
    writers = limiter("unit", 4)  # the link's writes wait for one of these
    taken = [object() for _ in range(4)]
    for holder in taken:
        await writers.acquire_on_behalf_of(holder)
    try:
        with anyio.fail_after(3), anyio.move_on_after(0.1) as scope:
            await client.start(StartRequest(("sleep", "300")))
        assert scope.cancelled_caught
    finally:
        for holder in taken:
            writers.release_on_behalf_of(holder)
    assert [k for k, _, _ in manager.sent].count(ord("S")) == 1, "the second was never sent"
    await client.aclose()


async def test_leaving_an_attach_whose_process_just_exited_keeps_the_link() -> None:
    # The manager answers every detach with `Y`, even for an attach its exit already
    # ended; a reader that leaves before taking the `X` sends one. That `Y` is no lie.
    def exits(kind: int, rid: int, payload: bytes) -> list[bytes]:
        if kind == ord("A"):
            return [frame("X", rid, b'{"code": 0}')]
        if kind == ord("D"):
            return [frame("Y", rid)]
        return _starts(kind, rid, payload)

    manager = FakeHelper(exits, HELLO)
    client = _client(manager)
    for _ in range(20):
        async with client.attach("e1-7", 0):
            await anyio.sleep(0.01)  # the `X` is in the box, not taken
    link = client._link  # pyright: ignore[reportPrivateUsage]
    assert link is not None and link.dead is None, link and link.dead
    assert [k for k, _, _ in manager.sent].count(ord("D")) == 20
    await client.aclose()


async def test_a_reader_gives_the_window_back_as_it_takes_output() -> None:
    chunk = b"x" * 32768
    count = WINDOW // len(chunk) + 2

    unsent = count

    def chunks(rid: int, size: int) -> list[bytes]:
        nonlocal unsent
        sent = min(unsent, size // len(chunk))
        unsent -= sent
        return [frame("o", rid, chunk)] * sent

    def stream(kind: int, rid: int, payload: bytes) -> list[bytes]:
        if kind == ord("A"):
            assert _json(payload) == {"proc": 7, "offset": 0, "window": WINDOW}
            return [frame("B", rid, b'{"offset": 0, "dropped": 0}'), *chunks(rid, WINDOW)]
        if kind == ord("W"):
            return chunks(rid, _json(payload)["bytes"])
        return _starts(kind, rid, payload)

    manager = FakeHelper(stream, HELLO)
    client = _client(manager)
    got = 0
    async with client.attach("e1-7", 0) as items:
        async for item in items:
            if isinstance(item, Gap):
                assert item == Gap(offset=0, dropped=0)
                continue
            assert not isinstance(item, ProcessExited)
            got += len(item[1])
            if got == count * len(chunk):
                break
    grants = sum(_json(p)["bytes"] for k, _, p in manager.sent if k == ord("W"))
    assert grants >= WINDOW // 2, "taken output is given back as window"
    assert any(k == ord("D") for k, _, _ in manager.sent), "a reader that leaves detaches"
    await client.aclose()


async def test_processes_the_sandboxs_end_took_report_killed() -> None:
    manager = FakeHelper(_starts, HELLO)
    client = _client(manager)
    id = await client.start(StartRequest(("sleep", "300")))
    client.reset()
    async with client.attach(id, 0) as items:
        assert [item async for item in items] == [KILLED]
    await client.kill(id)  # already gone: nothing to do
    with pytest.raises(ProcessNotFound, match="ended with the sandbox's workload"):
        await client.write(id, b"x")
    await client.aclose()


async def test_refusals_name_the_process() -> None:
    def refuse(kind: int, rid: int, payload: bytes) -> list[bytes]:
        if kind == ord("I"):
            return [frame("F", rid, b'{"kind": "stdin", "message": "no stdin"}')]
        if kind == ord("Z"):
            return [frame("F", rid, b'{"kind": "pty", "message": "no terminal"}')]
        return _starts(kind, rid, payload)

    client = _client(FakeHelper(refuse, HELLO))
    with pytest.raises(ConfigError, match="e1-7.*no stdin"):
        await client.write("e1-7", b"x")
    with pytest.raises(ConfigError, match="no terminal"):
        await client.resize("e1-7", PtySize())
    await client.aclose()


def _attacher(*frames: bytes) -> FakeHelper:
    """A manager that answers the first attach with `frames` (`{id}` in them: its id)."""

    def answer(kind: int, rid: int, payload: bytes) -> list[bytes]:
        if kind == ord("A"):
            return [f.replace(b"{id}", rid.to_bytes(4, "big")) for f in frames]
        return _starts(kind, rid, payload)

    return FakeHelper(answer, HELLO)


def _on(kind: str, payload: bytes = b"") -> bytes:
    """A frame for the attach's own id (see `_attacher`)."""
    return frame(kind, 0, payload)[:5] + b"{id}" + payload


GAP = b'{"offset": 0, "dropped": 0}'
PAST_THE_WINDOW = [_on("o", b"x" * 32768)] * (WINDOW // 32768) + [_on("o", b"forged")]


@pytest.mark.parametrize(
    ("frames", "said"),
    [
        (PAST_THE_WINDOW, "6 bytes on attach 1, 0 left of its window"),
        ([_on("o", b"")], "0 bytes on attach 1, 262144 left of its window"),
        ([_on("B", GAP)] * (GAPS_IN_A_ROW + 1), "'B' on attach 1"),
        ([_on("X", b"{}"), _on("o", b"forged")], "'o' on attach 1 after its end"),
        ([frame("o", 99, b"forged")], "a frame for id 99, which was never asked for"),
    ],
)
async def test_frames_the_protocol_does_not_allow_end_the_link_never_as_data(
    frames: list[bytes], said: str
) -> None:
    manager = _attacher(*frames)
    client = _client(manager)
    data: list[bytes] = []
    async with client.attach("e1-7", 0) as items:
        link = client._link  # pyright: ignore[reportPrivateUsage]
        assert link is not None
        # All of it arrives before anything is taken: the link is shut for it.
        assert await anyio.to_thread.run_sync(manager.closed.wait, 5)
        with contextlib.suppress(ProviderError):
            data += [item[1] async for item in items if isinstance(item, tuple)]
    assert link.dead == f"the helper broke the protocol: {said}"
    assert b"forged" not in data and sum(map(len, data)) <= WINDOW
    assert manager.closed.is_set(), "the link was shut: the next call makes a new one"


async def test_a_second_reply_to_one_call_ends_the_link() -> None:
    def twice(kind: int, rid: int, payload: bytes) -> list[bytes]:
        if kind == ord("G"):
            return [frame("Y", rid) + frame("Y", rid)]  # one read: both reach its mailbox
        return _starts(kind, rid, payload)

    manager = FakeHelper(twice, HELLO)
    client = _client(manager)
    await client.signal("e1-7", 2)
    link = client._link  # pyright: ignore[reportPrivateUsage]
    assert link is not None
    assert link.dead == "the helper broke the protocol: a second reply on id 1"
    assert manager.closed.is_set()


def test_a_link_reads_past_its_burst_only_at_its_rate() -> None:
    pace = Pace(rate=100, burst=50)
    assert pace.spend(50) == 0.0  # the burst
    waited = pace.spend(100)  # a second's worth past it
    assert 0.9 < waited <= 1.0
