"""Credential routes on a real engine: the agent reaches an HTTPS upstream that needs a
key through corral's proxy, under `no-network`, and the key appears nowhere in the
sandbox (its environment, process list, files, or any response: not when the upstream
names the bare key it got, base64-, JSON- or hex-encoded, or gzip-compressed); the route
serves only in its phases, streams as the upstream sends, and answers no other sandbox;
a sandbox that floods the proxy with silent connections spends only its session's
budget of the harness's descriptors, and the route works afterwards."""

from __future__ import annotations

import base64
import gzip
import json
import secrets
import time
from pathlib import Path
from typing import ClassVar

import anyio
import pytest
from pydantic import SecretStr

from corral import EnvironmentSession, ExecutionPlan, NetworkSchedule, TaskRun
from corral.core.credentials import CredentialRoute
from corral.core.credproxy import MAX_CONNECTIONS
from tests.integration.docker.conftest import TEST_IMAGE, make_env
from tests.tls_upstream import QuietHandler, upstream_fixture

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


#: a sandbox's flood: argv[1] silent connections to its route's proxy, held 5 s
FLOOD = """
import os, socket, sys, time, urllib.parse
url = urllib.parse.urlsplit(os.environ["CORRAL_CRED_MODEL_URL"])
held = []
for _ in range(int(sys.argv[1])):
    try:
        held.append(socket.create_connection((url.hostname, url.port), timeout=5))
    except OSError:
        pass
print(len(held), flush=True)
time.sleep(5)
"""


def _named(key: str) -> bytes:
    """What an upstream that names the key it got says (a common API error's shape),
    in the forms an API may say it in."""
    raw = key.encode()
    forms = [raw, base64.b64encode(raw), base64.b64encode(b"id:" + raw), json.dumps([key])]
    return b"Incorrect API key provided: " + b" ".join(
        form if isinstance(form, bytes) else form.encode() for form in [*forms, raw.hex()]
    )


class Upstream(QuietHandler):
    """An API that wants `X-Api-Key`: /v1/hello, /v1/stream (three events, 0.6 s apart),
    /v1/leak (which echoes the key back, in a header and the body); /v1/named and
    /v1/named.gz answer 401 naming the bare key of an `Authorization: Bearer` header."""

    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        Upstream.seen.append({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
        if self.path.startswith("/v1/named"):
            self._name_the_key()
            return
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

    def _name_the_key(self) -> None:
        body = _named(self.headers.get("Authorization", "").removeprefix("Bearer "))
        if self.path.endswith(".gz"):
            self.answer(401, {"Content-Encoding": "gzip"}, gzip.compress(body))
        else:
            self.answer(401, {}, body)


upstream = upstream_fixture(Upstream)


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


def _bearer_plan(upstream: tuple[int, Path]) -> ExecutionPlan:
    port, ca = upstream
    route = CredentialRoute(
        upstream=f"https://127.0.0.1:{port}/v1",
        headers={"Authorization": SecretStr(f"Bearer {KEY}")},
        ca_file=str(ca),
    )
    return ExecutionPlan(
        image=TEST_IMAGE,
        network=NetworkSchedule(baseline="no-network"),
        credentials={"model": route},
    )


async def test_an_upstream_naming_the_bare_key_gives_none_of_it_back(
    owner: str, upstream: tuple[int, Path], runtime: str
) -> None:
    async with make_env(owner, runtime=runtime).session(_bearer_plan(upstream)) as sandbox:
        url = (await sandbox.exec(["sh", "-c", "echo $CORRAL_CRED_MODEL_URL"])).stdout.strip()
        plain = await _fetch(sandbox, f"{url}/named")
        compressed = await _fetch(sandbox, f"{url}/named.gz")
    named = _named(KEY).split(b": ", 1)[1].split()
    for said in (plain, compressed):
        text = "\n".join(said).encode()
        assert said[0].startswith("401") and b"[redacted by corral]" in text, said
        assert [form for form in named if form in text] == [], said


async def test_a_sandbox_flooding_its_proxy_spends_only_its_budget(
    owner: str, upstream: tuple[int, Path]
) -> None:
    async with make_env(owner).session(_bearer_plan(upstream)) as sandbox:
        url = (await sandbox.exec(["sh", "-c", "echo $CORRAL_CRED_MODEL_URL"])).stdout.strip()
        before, grown, flood = _descriptors(), 0, list[str]()
        async with anyio.create_task_group() as group:

            async def run_flood() -> None:
                done = await sandbox.exec(["python3", "-c", FLOOD, "2000"], timeout=120)
                flood.append(done.stdout.strip())
                group.cancel_scope.cancel()

            group.start_soon(run_flood)
            while True:
                grown = max(grown, _descriptors() - before)
                await anyio.sleep(0.05)
        after = await _fetch(sandbox, f"{url}/named")
    assert flood == ["2000"], "the sandbox's connections were all made"
    assert grown <= MAX_CONNECTIONS + 16, f"the harness grew by {grown} descriptors"
    assert after[0].startswith("401") and KEY not in "\n".join(after), after


def _descriptors() -> int:
    return sum(1 for _ in Path("/proc/self/fd").iterdir())
