"""corral's credential proxy on loopback against a real TLS upstream (no engine): an
upstream that names the key it got, plainly or encoded or compressed, gives none of it
back; one client cannot spend more of the harness's descriptors than its session's
budget, a silent connection ends at the head deadline, and the route outlives the
harness running out of descriptors. The same against a real engine:
tests/integration/docker/test_docker_credentials.py."""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import logging
import resource
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from corral.core.credentials import CredentialRoute
from corral.core.credproxy import CredentialProxy, ProxyBudget
from corral.core.secretforms import REDACTED
from tests.tls_upstream import QuietHandler, upstream_fixture

KEY = f"sk-loop-{secrets.token_hex(16)}"
#: what an upstream that names the key it got says, in the forms it may say it in
NAMED = [
    KEY.encode(),
    base64.b64encode(KEY.encode()),
    base64.b64encode(b"x" + KEY.encode())[2:-2],  # its characters in a longer stream
    json.dumps({"key": KEY}).encode(),
    KEY.encode().hex().encode(),
]
#: a client that opens argv[1] connections to argv[2]:argv[3] once told to (a line on
#: stdin), says "held", and holds them until stdin closes
FLOOD = """
import socket, sys
sys.stdin.readline()
held = [socket.create_connection((sys.argv[2], int(sys.argv[3]))) for _ in range(int(sys.argv[1]))]
print("held", flush=True)
sys.stdin.read()
"""


class Upstream(QuietHandler):
    """/v1/hello; /v1/named (a 401 naming the key it got, in every form of `NAMED`);
    /v1/gzip (the same, gzip-compressed); /v1/br (an encoding corral cannot read);
    /v1/bomb (1 MiB of gzip-compressed zeros); /v1/big (3 MiB of them, then the 401's
    body); a POST, after a second, 200."""

    def do_GET(self) -> None:
        got = self.headers.get("Authorization", "").removeprefix("Bearer ").encode()
        named = b"Incorrect API key provided: " + b" ".join(
            form.replace(KEY.encode(), got) for form in NAMED
        )
        status, headers, body = {
            "/v1/hello": (200, {}, b"hello from upstream\n"),
            "/v1/named": (401, {"X-Got": got.decode()}, named),
            "/v1/gzip": (401, {"Content-Encoding": "gzip"}, gzip.compress(named)),
            "/v1/br": (200, {"Content-Encoding": "br"}, named),
            "/v1/bomb": (200, {"Content-Encoding": "gzip"}, gzip.compress(bytes(1 << 20))),
            "/v1/big": (401, {"Content-Encoding": "gzip"}, gzip.compress(bytes(3 << 20) + named)),
        }[self.path]
        self.answer(status, headers, body)

    def do_POST(self) -> None:
        time.sleep(1)  # the proxy has sent the whole body, or given up on it, by then
        self.answer(200, {}, b"")


upstream = upstream_fixture(Upstream)


@contextmanager
def _proxy(upstream: tuple[int, Path], **budget: Any) -> Generator[CredentialProxy]:
    port, ca = upstream
    route = CredentialRoute(
        upstream=f"https://127.0.0.1:{port}/v1",
        headers={"Authorization": SecretStr(f"Bearer {KEY}")},
        ca_file=str(ca),
    )
    proxy = CredentialProxy(
        {"model": route},
        host="127.0.0.1",
        peers={"127.0.0.1"},
        phase=lambda: "run",
        sandbox_id="unit",
        budget=ProxyBudget(**budget),
    )
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.close()


def _get(proxy: CredentialProxy, path: str) -> tuple[int, dict[str, str], bytes]:
    url = proxy.env()["CORRAL_CRED_MODEL_URL"] + path
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def _descriptors() -> int:
    return sum(1 for _ in Path("/proc/self/fd").iterdir())


@contextmanager
def _flood(proxy: CredentialProxy, count: int) -> Generator[subprocess.Popen[str]]:
    """A client process (its descriptors are not this one's) ready to open `count`
    silent connections: write a line to its stdin to start it."""
    argv = [sys.executable, "-c", FLOOD, str(count), proxy.host, str(proxy.port)]
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as flood:
        assert flood.stdin is not None and flood.stdout is not None
        try:
            yield flood
        finally:
            _end(flood)


def _end(flood: subprocess.Popen[str]) -> None:
    assert flood.stdin is not None
    flood.stdin.close()
    flood.wait(10)


def _start(flood: subprocess.Popen[str]) -> None:
    assert flood.stdin is not None and flood.stdout is not None
    flood.stdin.write("go\n")
    flood.stdin.flush()
    assert flood.stdout.readline() == "held\n"


def test_an_upstream_that_names_the_key_gets_none_of_it_back(upstream: tuple[int, Path]) -> None:
    with _proxy(upstream) as proxy:
        named = _get(proxy, "/named")
        compressed = _get(proxy, "/gzip")
        unreadable = _get(proxy, "/br")
    for status, headers, body in (named, compressed):
        said = json.dumps(headers).encode() + body
        assert status == 401 and REDACTED in body, body
        assert [form for form in NAMED if form in said] == [], said
    assert "Content-Encoding" not in compressed[1], "the body comes back decoded"
    assert unreadable[0] == 502 and b"'br'" in unreadable[2], unreadable


def test_a_compressed_body_larger_than_a_decoded_piece_comes_back_whole(
    upstream: tuple[int, Path],
) -> None:
    with _proxy(upstream) as proxy:
        status, _, body = _get(proxy, "/big")
    assert status == 401 and body.startswith(bytes(3 << 20)) and body.endswith(REDACTED)
    assert [form for form in NAMED if form in body] == []


def test_a_body_that_inflates_past_the_budget_is_cut(
    upstream: tuple[int, Path], caplog: pytest.LogCaptureFixture
) -> None:
    budget = {"decoded_bytes": 64 * 1024}
    with _proxy(upstream, **budget) as proxy, pytest.raises(http.client.IncompleteRead):
        _get(proxy, "/bomb")
    assert "budget=decoded_bytes" in caplog.text


def test_silent_connections_spend_only_the_budget(
    upstream: tuple[int, Path], caplog: pytest.LogCaptureFixture
) -> None:
    with _proxy(upstream, connections=8, head_timeout_s=2.0) as proxy, _flood(proxy, 200) as flood:
        before = _descriptors()
        _start(flood)
        grown = max(_descriptors() - before for _ in range(50) if time.sleep(0.02) is None)
        time.sleep(3)  # the head deadline frees the 8 held while the flood still holds its 200
        status, _, body = _get(proxy, "/hello")
    assert grown <= 8 + 2, f"the proxy holds {grown} descriptors for one session"
    assert (status, body) == (200, b"hello from upstream\n")
    assert "budget=connections" in caplog.text


def test_the_head_deadline_closes_a_silent_connection(upstream: tuple[int, Path]) -> None:
    with _proxy(upstream, head_timeout_s=0.5) as proxy:
        silent = socket.create_connection((proxy.host, proxy.port))
        silent.settimeout(10)
        started = time.monotonic()
        with silent:
            assert silent.recv(1) == b""
        assert time.monotonic() - started < 3


def test_a_head_over_its_bytes_ends_the_connection(
    upstream: tuple[int, Path], caplog: pytest.LogCaptureFixture
) -> None:
    with _proxy(upstream, head_bytes=4096) as proxy:
        client = socket.create_connection((proxy.host, proxy.port))
        client.settimeout(10)
        with client:
            client.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 8192)
            assert client.recv(1) == b""
    assert "budget=head_bytes" in caplog.text


def test_a_body_over_its_bytes_is_refused(
    upstream: tuple[int, Path], caplog: pytest.LogCaptureFixture
) -> None:
    with _proxy(upstream, body_bytes=1000) as proxy:
        url = proxy.env()["CORRAL_CRED_MODEL_URL"] + "/hello"
        with pytest.raises(urllib.error.HTTPError) as declared:
            urllib.request.urlopen(urllib.request.Request(url, data=bytes(2000)), timeout=10)
        chunks = (bytes(500) for _ in range(4))
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
            urllib.request.urlopen(urllib.request.Request(url, data=chunks), timeout=10)
    assert declared.value.code == 413
    assert "budget=body_bytes" in caplog.text


def test_the_route_outlives_the_harness_running_out_of_descriptors(
    upstream: tuple[int, Path], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "corral.credentials")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with _proxy(upstream, connections=1000) as proxy, _flood(proxy, 50) as flood:
        resource.setrlimit(resource.RLIMIT_NOFILE, (_descriptors() + 5, hard))
        try:
            _start(flood)
            time.sleep(1)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        _end(flood)
        status, _, body = _get(proxy, "/hello")
    assert (status, body) == (200, b"hello from upstream\n")
    assert "budget=descriptors" in caplog.text
