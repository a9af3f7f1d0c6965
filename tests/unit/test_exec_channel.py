"""The exec channel's shared protocol (`corral.helper.channel`) against a fake helper, and
the two transports' framing (Docker's engine stream headers, the k8s websocket)."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from typing import Any

import anyio
import pytest
from anyio.lowlevel import current_token
from websocket import ABNF

from corral.core.session import ExecRequest
from corral.errors import ProviderError
from corral.helper.channel import Channel, Refused
from corral.helper.link import (
    MAX_FRAME,
    ChannelUnavailable,
    FrameParser,
    ProtocolError,
    frame,
    merged,
)
from corral.providers.docker.channel import EngineStream
from corral.providers.k8s.websocket import PORT_FORWARD, WebSocketTransport
from tests.unit.fake_helper import FakeHelper

pytestmark = pytest.mark.anyio


def test_frames_survive_any_split() -> None:
    data = frame("o", 7, b"hello") + frame("X", 7, b'{"code": 3}') + frame("H", 0)
    for cut in range(len(data) + 1):
        parser = FrameParser()
        got = parser.feed(data[:cut]) + parser.feed(data[cut:])
        assert got == [(ord("o"), 7, b"hello"), (ord("X"), 7, b'{"code": 3}'), (ord("H"), 0, b"")]


@pytest.mark.parametrize("size", [0, 4, MAX_FRAME + 1])
def test_a_frame_of_a_bad_size_is_nonsense(size: int) -> None:
    with pytest.raises(ProtocolError):
        FrameParser().feed(struct.pack(">IBI", size, ord("o"), 1))


def test_runs_of_one_ids_output_are_merged_and_nothing_else_is() -> None:
    o, e, x = ord("o"), ord("e"), ord("X")
    frames = [
        (o, 1, b"a"),
        (o, 1, b"b"),
        (o, 2, b"c"),
        (o, 1, b"d"),
        (e, 1, b"e"),
        (e, 1, b"f"),
        (x, 1, b"{}"),
        (x, 1, b"{}"),
        (o, 1, b"g"),
    ]
    assert merged(frames, frozenset((o, e))) == [
        (o, 1, b"ab"),
        (o, 2, b"c"),
        (o, 1, b"d"),
        (e, 1, b"ef"),
        (x, 1, b"{}"),
        (x, 1, b"{}"),
        (o, 1, b"g"),
    ]
    assert merged(frames, frozenset()) == frames


async def _channel(helper: FakeHelper) -> Channel:
    channel = Channel(helper, current_token(), "unit", 4, "sid")
    channel.start_reader()
    await channel.await_hello()
    return channel


async def _no_kill(marker: str, user: str | None) -> None:
    raise AssertionError("the plain path was not needed")


def _runner(kind: int, rid: int, payload: bytes) -> list[bytes]:
    if kind == ord("R"):
        spec = json.loads(payload)
        if spec["argv"][0] == "refuse":
            return [frame("F", rid, b"no such program")]
        if spec["argv"][0] == "hang":
            return []
        code = {"code": len(spec["argv"])}
        return [
            frame("o", rid, b"out"),
            frame("e", rid, b"err"),
            frame("X", rid, json.dumps(code).encode()),
        ]
    if kind == ord("K"):
        return [frame("X", rid, b'{"code": 137, "killed": true}')]
    return []


async def test_a_call_streams_and_exits_and_says_who_runs_it() -> None:
    helper = FakeHelper(_runner)
    channel = await _channel(helper)
    seen: list[tuple[str, str]] = []
    result = await channel.run(
        ExecRequest(
            ("a", "b"),
            env={"K": "V"},
            stdin=b"x" * 70000,
            on_output=lambda s, t: seen.append((s, t)),
        ),
        user=None,
        cwd="",
        kill_fallback=_no_kill,
    )
    assert not isinstance(result, Refused)
    assert (result.returncode, result.stdout, result.stderr) == (2, "out", "err")
    assert seen == [("stdout", "out"), ("stderr", "err")]
    spec = json.loads(helper.sent[0][2])
    assert spec["as_self"] is True and spec["argv"] == ["a", "b"] and "K=V" in spec["env"]
    kinds = [chr(k) for k, _, _ in helper.sent]
    assert kinds == ["R", "I", "I", "C"], "stdin in chunks, then its end"
    channel.close()
    await channel.join(5)


async def test_a_refusal_goes_to_plain_exec_and_a_user_is_passed_on() -> None:
    helper = FakeHelper(_runner)
    channel = await _channel(helper)
    outcome = await channel.run(
        ExecRequest(("refuse",)), user="1000", cwd="/", kill_fallback=_no_kill
    )
    assert outcome == Refused("no such program")
    spec = json.loads(helper.sent[0][2])
    assert spec["user"] == "1000" and spec["as_self"] is False
    channel.close()
    await channel.join(5)


async def test_a_timeout_kills_through_the_helper() -> None:
    helper = FakeHelper(_runner)
    channel = await _channel(helper)
    result = await channel.run(
        ExecRequest(("hang",), timeout=0.2), user=None, cwd="", kill_fallback=_no_kill
    )
    assert not isinstance(result, Refused)
    assert result.timed_out and result.returncode == 124
    assert [chr(k) for k, _, _ in helper.sent] == ["R", "K"]
    assert channel.dead is None, "a confirmed kill keeps the channel"
    channel.close()
    await channel.join(5)


async def test_the_timeout_counts_from_the_call_a_slow_stdin_included() -> None:
    # The stream takes the stdin slowly (a full socket buffer): the timeout used to start
    # only once it was all written, so a call could outlive its timeout by the write.
    class SlowStream(FakeHelper):
        def send(self, data: bytes) -> None:
            if data[4:5] == b"R":
                time.sleep(1.0)
            super().send(data)

    helper = SlowStream(_runner)
    channel = await _channel(helper)
    started = time.monotonic()
    result = await channel.run(
        ExecRequest(("hang",), timeout=0.3, stdin=b"x" * 10),
        user=None,
        cwd="",
        kill_fallback=_no_kill,
    )
    assert not isinstance(result, Refused)
    assert result.timed_out
    assert time.monotonic() - started < 1.25, "the timeout waited for the write to end first"
    channel.close()
    await channel.join(5)


async def test_a_channel_that_breaks_mid_call_raises_and_kills_through_the_plain_path() -> None:
    helper = FakeHelper(_runner)
    channel = await _channel(helper)
    killed: list[str] = []

    async def fallback(marker: str, user: str | None) -> None:
        killed.append(marker)

    async def breaker() -> None:
        await anyio.sleep(0.1)
        helper.die()

    failures: list[str] = []

    async def victim() -> None:
        try:
            await channel.run(ExecRequest(("hang",)), user=None, cwd="", kill_fallback=fallback)
        except ProviderError as exc:
            failures.append(str(exc))

    async with anyio.create_task_group() as tg:
        tg.start_soon(breaker)
        tg.start_soon(victim)
    assert len(failures) == 1 and "exec channel broke" in failures[0]
    assert "fake stderr" in failures[0], "the helper's own words are kept"
    assert len(killed) == 1, "the tree was killed from outside"
    assert channel.dead is not None
    with pytest.raises(ProviderError, match="exec channel broke"):
        await channel.run(ExecRequest(("a",)), user=None, cwd="", kill_fallback=fallback)
    await channel.join(5)


@pytest.mark.parametrize("hello", [b'{"version": 99}', b"garbage"])
async def test_a_helper_of_another_kind_is_unavailable(hello: bytes) -> None:
    helper = FakeHelper(_runner, hello=hello)
    channel = Channel(helper, current_token(), "unit", 4, "sid")
    channel.start_reader()
    with pytest.raises(ChannelUnavailable):
        await channel.await_hello()
    channel.close()
    await channel.join(5)


def test_the_engine_stream_keeps_stdout_and_bounds_stderr() -> None:
    def chunk(stream: int, data: bytes) -> bytes:
        return bytes([stream, 0, 0, 0]) + len(data).to_bytes(4, "big") + data

    data = chunk(1, b"frames") + chunk(2, b"oops" * 1000) + chunk(1, b"more")
    engine = EngineStream()
    got = b"".join(engine.feed(data[i : i + 5]) for i in range(0, len(data), 5))
    assert got == b"framesmore"
    assert len(engine.diagnostics) == 2048
    with pytest.raises(ProtocolError):
        EngineStream().feed(chunk(7, b"x"))


def _connected() -> tuple[Any, socket.socket]:
    """A websocket-client stand-in over one end of a socket pair, and the other end (the
    API server's side)."""
    ours, theirs = socket.socketpair()

    def getsubprotocol(self: object) -> str:
        return "v5.channel.k8s.io"

    ws: Any = type("WS", (), {"sock": ours, "getsubprotocol": getsubprotocol})()
    return ws, theirs


def _read_all(transport: WebSocketTransport) -> bytes:
    got = b""
    while data := transport.recv():
        got += data
    return got


def _server_frame(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    header = bytes([(0x80 if fin else 0) | opcode])
    if len(payload) < 126:
        return header + bytes([len(payload)]) + payload
    if len(payload) < 65536:
        return header + bytes([126]) + len(payload).to_bytes(2, "big") + payload
    return header + bytes([127]) + len(payload).to_bytes(8, "big") + payload


def test_the_websocket_transport_routes_channels_fragments_and_pings() -> None:
    ws, server = _connected()
    transport = WebSocketTransport(ws)
    big = b"y" * 70000
    server.sendall(
        _server_frame(ABNF.OPCODE_BINARY, b"\x01hel", fin=False)
        + _server_frame(ABNF.OPCODE_CONT, b"lo")
        + _server_frame(ABNF.OPCODE_BINARY, b"\x02diag")
        + _server_frame(ABNF.OPCODE_PING, b"p")
        + _server_frame(ABNF.OPCODE_BINARY, b"\x01" + big)
        + _server_frame(ABNF.OPCODE_BINARY, b"\x03{status}")
        + _server_frame(ABNF.OPCODE_CLOSE, b"")
    )
    assert _read_all(transport) == b"hello" + big, "a close frame ends the stream"
    assert transport.diagnostics() == "diag; {status}"
    assert server.recv(1)[:1] == bytes([0x80 | ABNF.OPCODE_PONG]), "a ping is answered"
    transport.close()
    with pytest.raises(OSError):
        transport.send(b"late")
    ws, server = _connected()
    server.sendall(bytes([0x82, 127]) + (1 << 40).to_bytes(8, "big"))
    with pytest.raises(ProtocolError):
        WebSocketTransport(ws).recv()


def test_the_websocket_transport_gives_plain_exec_every_channel_and_writes_while_it_reads() -> None:
    """Plain exec queues its stdin and reads meanwhile: a peer that writes more than the
    socket holds before it reads stdin never deadlocks it (it used to write all first)."""
    ws, server = _connected()
    transport = WebSocketTransport(ws)
    stdin = b"s" * (8 << 20)
    transport.queue(stdin)
    transport.queue_close()
    out = b"o" * (4 << 20)
    received = bytearray()

    def peer() -> None:  # all its output first, then its stdin
        server.sendall(
            _server_frame(ABNF.OPCODE_BINARY, b"\x01" + out)
            + _server_frame(ABNF.OPCODE_BINARY, b"\x02err")
            + _server_frame(ABNF.OPCODE_BINARY, b"\x03{}")
        )
        while chunk := server.recv(1 << 20):
            received.extend(chunk)

    thread = threading.Thread(target=peer)
    thread.start()
    frames: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 30
    while transport.backlog() or sum(len(d) for _, d in frames) < len(out) + 5:
        assert time.monotonic() < deadline, "stdin and output did not both get through"
        got = transport.exchange(0.05)
        assert got is not None
        frames += got
    assert transport.exchange(0.01) == [], "nothing more came: the wait is bounded"
    transport.close()
    thread.join()
    server.close()
    assert b"".join(d for c, d in frames if c == 1) == out
    assert [(c, d) for c, d in frames if c != 1] == [(2, b"err"), (3, b"{}")]
    assert len(received) > len(stdin)
    close, mask = received[-8:-6], received[-6:-2]
    assert close == bytes([0x82, 0x82]), "a masked two-byte binary frame ends the stream"
    assert ABNF.mask(bytes(mask), bytes(received[-2:])) == bytes([255, 0]), (
        "stdin's end (v5 CLOSE) comes last"
    )


def test_the_port_forward_layout_drops_each_channels_port_and_keeps_its_errors() -> None:
    ws, server = _connected()
    transport = WebSocketTransport(ws, PORT_FORWARD)
    port = (8080).to_bytes(2, "little")
    server.sendall(
        _server_frame(ABNF.OPCODE_BINARY, b"\x00" + port)
        + _server_frame(ABNF.OPCODE_BINARY, b"\x01" + port)
        + _server_frame(ABNF.OPCODE_BINARY, b"\x00HTTP/1.1 200")
        + _server_frame(ABNF.OPCODE_BINARY, b"\x00\x90\x1f more")
        + _server_frame(ABNF.OPCODE_BINARY, b"\x01connection refused")
    )
    server.shutdown(socket.SHUT_WR)
    got = _read_all(transport)
    assert got == b"HTTP/1.1 200\x90\x1f more", "only the first two bytes of a channel are its port"
    assert transport.diagnostics() == "connection refused"
    transport.close()
    server.close()


async def test_the_reader_paces_only_output_that_no_caller_keeps() -> None:
    # A call keeps the head and tail of each stream: that much is read at full speed (a
    # 1 MiB print costs no wait); what a flood sends past it, and every frame's header
    # (empty frames are no free ride), is paced.
    channel = Channel(FakeHelper(_runner), current_token(), "unit", 4, "sid")
    o, x = ord("o"), ord("X")
    channel.keep(1, 100)
    unkept = channel._unkept  # pyright: ignore[reportPrivateUsage]
    header = 9
    assert unkept([(o, 1, b"a" * 60)]) == header
    assert unkept([(o, 1, b"a" * 60)]) == header + 20  # 40 were left
    assert unkept([(o, 1, b"")] * 3) == 3 * header
    assert unkept([(o, 2, b"a" * 10)]) == header + 10  # an id no caller keeps
    channel.keep(3, 100)
    assert unkept([(x, 3, b"a" * 10)]) == header + 10  # not output
    channel.close_box(3, channel.open_box(3))
    assert unkept([(o, 3, b"a" * 10)]) == header + 10  # the call is over
