"""Credential routes on a real engine: the agent reaches an HTTPS upstream that needs a
key through corral's proxy, under `no-network`, and the key appears nowhere in the
sandbox (its environment, process list, files, or any response); the route serves only
in its phases, streams as the upstream sends, and answers no other sandbox."""

from __future__ import annotations

import http.server
import json
import secrets
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import SecretStr

from corral import EnvironmentSession, ExecutionPlan, NetworkSchedule, TaskRun
from corral.core.credentials import CredentialRoute
from tests.integration.docker.conftest import TEST_IMAGE, make_env

pytestmark = pytest.mark.anyio

KEY = f"sk-corral-test-{secrets.token_hex(12)}"

FETCH = """
import sys, time, urllib.error, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=20) as r:
        print(r.status, dict(r.headers).get("X-Echo", "-"))
        start = time.monotonic()
        for line in r:
            print(f"{time.monotonic() - start:.2f}", line.decode().rstrip())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode().strip())
except OSError as e:
    print("failed", type(e).__name__)
"""


class Upstream(http.server.BaseHTTPRequestHandler):
    """An API that wants `X-Api-Key`: /v1/hello, /v1/stream (three events, 0.6 s apart),
    /v1/leak (which echoes the key back, in a header and the body)."""

    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        Upstream.seen.append({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
        if self.headers.get("X-Api-Key") != KEY:
            self.send_response(401)
            self.end_headers()
            return
        self.send_response(200)
        if self.path == "/v1/leak":
            self.send_header("X-Echo", f"you sent {KEY}")
        self.end_headers()
        if self.path == "/v1/stream":
            for n in range(3):
                self.wfile.write(f"data: {n}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.6)
        elif self.path == "/v1/leak":
            self.wfile.write(f"your key is {KEY}, twice: {KEY}\n".encode())
        else:
            self.wfile.write(b"hello from upstream\n")

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """The upstream on this host's loopback over TLS, its certificate from a throwaway
    CA (the route's `ca_file`)."""
    d = tmp_path_factory.mktemp("ca")
    (d / "san").write_text("subjectAltName=IP:127.0.0.1\n")
    for argv in (
        "req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 1 -subj /CN=test-ca",
        "req -newkey rsa:2048 -nodes -keyout srv.key -out srv.csr -subj /CN=127.0.0.1",
        "x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out srv.pem -days 1 "
        "-extfile san",
    ):
        subprocess.run(["openssl", *argv.split()], cwd=d, check=True, capture_output=True)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(d / "srv.pem", d / "srv.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], d / "ca.pem"
    server.shutdown()
    thread.join()


async def _fetch(session: EnvironmentSession, url: str) -> list[str]:
    result = await session.exec(["python3", "-c", FETCH, url], timeout=60)
    return result.stdout.splitlines()


async def _everything_the_sandbox_holds(session: EnvironmentSession) -> str:
    """Its processes' environments and command lines, the process list, and every file
    written since the session began (nothing of the key is in the command itself)."""
    listed = await session.exec(
        [
            "sh",
            "-c",
            "cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null; ps -eo args; env; "
            "find / -xdev -type f -newer /tmp/.began ! -path '/proc/*' 2>/dev/null "
            "| xargs -r cat 2>/dev/null",
        ]
    )
    return listed.stdout + listed.stderr


async def test_the_agent_uses_a_key_it_never_holds(
    owner: str, upstream: tuple[int, Path], runtime: str
) -> None:
    port, ca = upstream
    route = CredentialRoute(
        upstream=f"https://127.0.0.1:{port}/v1",
        headers={"X-Api-Key": SecretStr(KEY)},
        phases=frozenset({"run"}),
        ca_file=str(ca),
    )
    plan = ExecutionPlan(
        image=TEST_IMAGE,
        network=NetworkSchedule(baseline="public", run="no-network", evaluation="no-network"),
        credentials={"model": route},
    )
    assert KEY not in repr(plan) and KEY not in json.dumps(plan.persisted())
    env = make_env(owner, runtime=runtime)
    Upstream.seen.clear()
    async with TaskRun(env, plan) as run:
        await run.session.exec(["touch", "/tmp/.began"])
        url = (await run.session.exec(["sh", "-c", "echo $CORRAL_CRED_MODEL_URL"])).stdout.strip()
        in_baseline = await _fetch(run.session, f"{url}/hello")
        async with run.running() as sandbox:
            hello = await _fetch(sandbox, f"{url}/hello")
            stream = await _fetch(sandbox, f"{url}/stream")
            leak = await _fetch(sandbox, f"{url}/leak")
            forged = await _fetch(sandbox, url.rsplit("/", 2)[0] + "/not-the-token/model/hello")
            held = await _everything_the_sandbox_holds(sandbox)
        in_evaluation = await run.evaluate(lambda s: _fetch(s, f"{url}/hello"))
    assert url.startswith("http://") and "/model" in url
    assert in_baseline[0].startswith("403"), in_baseline
    assert hello == ["200 -", "0.00 hello from upstream"], hello
    # The events came as the upstream sent them, 0.6 s apart, not all at the end.
    times = [float(line.split()[0]) for line in stream[1:] if "data:" in line]
    assert len(times) == 3 and times[2] - times[0] > 0.9, stream
    assert KEY not in "\n".join(leak) and "[redacted by corral]" in leak[1], leak
    assert forged[0].startswith("404"), forged
    assert KEY not in held, "the key is in the sandbox"
    assert in_evaluation[0].startswith("403"), in_evaluation
    # What the upstream saw: the key, added by the proxy; the route's own path.
    assert {s["path"] for s in Upstream.seen} == {"/v1/hello", "/v1/stream", "/v1/leak"}
    assert all(s["x-api-key"] == KEY and s["accept-encoding"] == "identity" for s in Upstream.seen)


async def test_another_sandbox_gets_nothing_from_a_route(
    owner: str, upstream: tuple[int, Path]
) -> None:
    port, ca = upstream
    route = CredentialRoute(
        upstream=f"https://127.0.0.1:{port}/v1",
        headers={"X-Api-Key": SecretStr(KEY)},
        ca_file=str(ca),
    )
    env = make_env(owner)
    Upstream.seen.clear()
    async with (
        env.session(ExecutionPlan(image=TEST_IMAGE, credentials={"model": route})) as holder,
        env.session(ExecutionPlan(image=TEST_IMAGE)) as other,
    ):
        url = (await holder.exec(["sh", "-c", "echo $CORRAL_CRED_MODEL_URL"])).stdout.strip()
        mine = await _fetch(holder, f"{url}/hello")
        theirs = await _fetch(other, f"{url}/hello")
    assert mine[0] == "200 -", mine
    assert theirs[0].startswith("failed"), theirs
    assert len(Upstream.seen) == 1, "the other sandbox's request never reached the upstream"
