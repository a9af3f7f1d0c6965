"""Exact by name for TLS and HTTP on a real engine (`corral.network.gate`).

One allowed address serves two names: `a.allowed.test`, which the policy allows, and
`fronted.other.test`, which it does not (a CDN's neighbour). Local test servers on that
address, with a throwaway CA, record every SNI and Host they are asked for: the allowed
name connects (its certificate verified end to end: the gate reads, never terminates),
the other, no SNI, and a second keep-alive request fronting the other name never reach a
server; UDP to the same address stays address-level. The HTTP server is Python's own
`http.server`, which ends a header line at a bare CR and reads a body it ignores as the
next request: what a smuggled Host would reach. A switch cuts what it no longer allows:
an open TLS flow for a name it drops, and a plain TCP flow to an address it drops.
"""

from __future__ import annotations

import http.server
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from corral import EnvironmentSession, ExecutionPlan, NetworkSchedule
from corral.providers.docker import DockerEnvironment
from tests.integration.conftest import ALLOWED_IP, DENIED_IP, TCP_PORT, UDP_PORT
from tests.integration.docker.conftest import TEST_IMAGE, make_env

pytestmark = pytest.mark.anyio

ALLOWED = "a.allowed.test"
FRONTED = "fronted.other.test"
OTHER = "b.allowed.test"
NAMES = (ALLOWED, OTHER, FRONTED)
CA_IN_SANDBOX = "/tmp/corral-test-ca.pem"
#: a TCP echo on ALLOWED_IP (not a gated port), whose connections stay open
ECHO_PORT = 8093

# Run in the sandbox by its own python: one TLS or HTTP exchange, printed as
# "ok <response>" or "refused <why>".
CLIENT = r"""
import socket, ssl, sys
mode, address = sys.argv[1], sys.argv[2]
def body(sock):
    data = b""
    while not data.partition(b"\r\n\r\n")[2]:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data.partition(b"\r\n\r\n")[2].decode()
try:
    sock = socket.create_connection((address, 443 if mode == "tls" else 80), timeout=5)
    if mode == "tls":
        name, ca = sys.argv[3], sys.argv[4]
        if name:
            ctx = ssl.create_default_context(cafile=ca)
        else:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        sock = ctx.wrap_socket(sock, server_hostname=name or None)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: %s\r\n\r\n" % name.encode())
        print("ok", body(sock))
    else:
        for host in sys.argv[3:]:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: %s\r\n\r\n" % host.encode())
            print("ok", body(sock))
except (OSError, ssl.SSLError) as exc:
    print("refused", type(exc).__name__)
"""

UDP_CLIENT = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
s.sendto(b"ping", (sys.argv[1], int(sys.argv[2])))
print(s.recv(100).decode())
"""


# Run in the sandbox: the bytes (hex) sent as they are on one connection to port 80, and
# what came back until it closed (or 5 s of quiet).
RAW_CLIENT = r"""
import socket, sys
sock = socket.create_connection((sys.argv[1], 80), timeout=5)
sock.sendall(bytes.fromhex(sys.argv[2]))
data = b""
try:
    while chunk := sock.recv(4096):
        data += chunk
except OSError as exc:
    data += b"|" + type(exc).__name__.encode()
print(repr(data))
"""

# Run in the sandbox: one connection (TLS to 443 for a name, or TCP to a port) that
# answers once, then waits for /tmp/switched-<label> and counts the exchanges it still
# carries, of 10: "carried N" (with "cut <error>" before it when it was cut).
HELD_CLIENT = r"""
import os, socket, ssl, sys, time
label, address, port, name, ca = sys.argv[1:6]
sock = socket.create_connection((address, int(port)), timeout=10)
if name:
    sock = ssl.create_default_context(cafile=ca).wrap_socket(sock, server_hostname=name)
def exchange():
    sock.sendall(b"GET / HTTP/1.1\r\nHost: %s\r\n\r\n" % name.encode())
    if not sock.recv(4096):
        raise ConnectionError("closed")
exchange()
open(f"/tmp/held-{label}", "w").close()
while not os.path.exists(f"/tmp/switched-{label}"):
    time.sleep(0.05)
carried = 0
try:
    for _ in range(10):
        exchange()
        carried += 1
except (OSError, ssl.SSLError) as exc:
    print("cut", type(exc).__name__)
print("carried", carried)
"""


class _AskedFor(http.server.BaseHTTPRequestHandler):
    """Python's own HTTP/1.1 server: answers a GET with the Host it read, and records it."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        assert isinstance(self.server, _HTTPServer)
        host = self.headers.get("Host", "")
        self.server.seen.append(f"host:{host}")
        body = f"served {host}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, seen: list[str]) -> None:
        super().__init__((ALLOWED_IP, 80), _AskedFor)
        self.seen = seen


class Servers:
    """A TLS server on 443 (each connection answering requests until it ends), Python's
    HTTP/1.1 keep-alive server on 80 of ALLOWED_IP, each answering with the name it was
    asked for and recording it, and an echo on ECHO_PORT."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.seen: list[str] = []
        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._tls.load_cert_chain(cert, key)
        self._tls.sni_callback = self._sni
        self._http = _HTTPServer(self.seen)
        threading.Thread(target=self._http.serve_forever, daemon=True).start()
        self._sockets = [
            socket.create_server((ALLOWED_IP, 443)),
            socket.create_server((ALLOWED_IP, ECHO_PORT)),
        ]
        for sock, handle in zip(self._sockets, (self._serve_tls, self._echo), strict=True):
            threading.Thread(target=self._accept, args=(sock, handle), daemon=True).start()

    def _sni(self, _sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
        self.seen.append(f"sni:{name}")

    def _accept(self, server: socket.socket, handle: object) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(conn,), daemon=True).start()  # type: ignore[arg-type]

    def _serve_tls(self, conn: socket.socket) -> None:
        try:
            with self._tls.wrap_socket(conn, server_side=True) as tls:
                tls.settimeout(60)  # a held flow waits out a switch
                while self._answer(tls):
                    pass
        except (OSError, ssl.SSLError):
            pass

    def _echo(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(60)
            try:
                while data := conn.recv(4096):
                    conn.sendall(data)
            except OSError:
                pass

    def _answer(self, conn: socket.socket) -> bool:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk:
                return False
            head += chunk
        host = next(
            (
                line.split(b":", 1)[1].strip().decode()
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"host:")
            ),
            "",
        )
        self.seen.append(f"host:{host}")
        body = f"served {host}".encode()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        return True

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        for sock in self._sockets:
            sock.close()


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A throwaway CA and one certificate for every name in NAMES."""
    d = tmp_path_factory.mktemp("gate-ca")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)

    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
            "-subj", "/CN=corral test CA")  # fmt: skip
    openssl("req", *ec, "-keyout", "srv.key", "-out", "srv.csr", "-subj", f"/CN={ALLOWED}")
    (d / "ext").write_text("subjectAltName=" + ",".join(f"DNS:{n}" for n in NAMES))
    openssl("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "srv.pem", "-days", "1", "-extfile", "ext")  # fmt: skip
    return d / "ca.pem", d / "srv.pem", d / "srv.key"


@pytest.fixture(scope="module")
def servers(ca: tuple[Path, Path, Path], compose_targets: None, upstream: str) -> Iterator[Servers]:
    running = Servers(ca[1], ca[2])
    yield running
    running.close()


@pytest.fixture
def gate_env(owner: str, upstream: str, runtime: str) -> DockerEnvironment:
    """Under each runtime (`RUNTIMES`): runsc behind a gateway."""
    return make_env(owner, upstream_dns_servers=[upstream], runtime=runtime)


async def client(sandbox: EnvironmentSession, *args: str) -> str:
    result = await sandbox.exec(["python3", "-c", CLIENT, *args], timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.parametrize("policy", [f"allowlist:{ALLOWED}", "allowlist:*.allowed.test"])
async def test_an_allowed_address_admits_only_the_allowed_name_over_tls_and_http(
    gate_env: DockerEnvironment,
    servers: Servers,
    ca: tuple[Path, Path, Path],
    policy: str,
) -> None:
    plan = ExecutionPlan(image=TEST_IMAGE, network=NetworkSchedule(baseline=policy))
    async with gate_env.session(plan) as sandbox:
        await sandbox.write_text(CA_IN_SANDBOX, ca[0].read_text())
        # Under a wildcard the address is admitted once corral's resolver answered for it.
        found = await sandbox.exec(["getent", "ahostsv4", ALLOWED])
        assert found.stdout.split()[0] == ALLOWED_IP, found
        servers.seen.clear()

        assert await client(sandbox, "tls", ALLOWED_IP, ALLOWED, CA_IN_SANDBOX) == (
            f"ok served {ALLOWED}"
        )
        fronted = await client(sandbox, "tls", ALLOWED_IP, FRONTED, CA_IN_SANDBOX)
        assert fronted.startswith("refused"), fronted
        assert (await client(sandbox, "tls", ALLOWED_IP, "", CA_IN_SANDBOX)).startswith(
            "refused"
        ), "TLS without SNI"

        assert await client(sandbox, "http", ALLOWED_IP, ALLOWED) == f"ok served {ALLOWED}"
        assert (await client(sandbox, "http", ALLOWED_IP, FRONTED)).startswith("refused")
        # Keep-alive: the first request is allowed, the second fronts the other name.
        fronting = await client(sandbox, "http", ALLOWED_IP, ALLOWED, FRONTED)
        first, second = fronting.splitlines()
        assert first == f"ok served {ALLOWED}" and second.startswith("refused"), fronting

        # What the servers were asked for: the allowed name only, never the other, and no
        # hello without a name.
        assert set(servers.seen) == {f"sni:{ALLOWED}", f"host:{ALLOWED}"}, servers.seen

        # UDP to the same address is address-level: the echo target answers.
        echo = await sandbox.exec(["python3", "-c", UDP_CLIENT, ALLOWED_IP, str(UDP_PORT)])
        assert echo.stdout.strip() == "echo:ping", echo


@pytest.mark.parametrize(
    "label, request_bytes",
    [
        # A server that ends a line at a bare CR reads the first Host (issue 40, item 3).
        ("bare CR", f"GET / HTTP/1.1\r\nX-Pad: 1\rHost: {FRONTED}\r\nHost: {ALLOWED}\r\n\r\n"),
        # Two requests in one write: the second fronts the other name.
        (
            "pipelined",
            f"GET / HTTP/1.1\r\nHost: {ALLOWED}\r\n\r\nGET / HTTP/1.1\r\nHost: {FRONTED}\r\n\r\n",
        ),
        # A body the server ignores, read by it as the next request.
        (
            "in a body",
            f"GET / HTTP/1.1\r\nHost: {ALLOWED}\r\nContent-Length: 46\r\n\r\n"
            f"GET / HTTP/1.1\r\nHost: {FRONTED}\r\n\r\n",
        ),
    ],
    ids=["bare-CR", "pipelined", "in-a-body"],
)
async def test_a_smuggled_host_never_reaches_the_server(
    gate_env: DockerEnvironment, servers: Servers, label: str, request_bytes: str
) -> None:
    plan = ExecutionPlan(image=TEST_IMAGE, network=NetworkSchedule(baseline=f"allowlist:{ALLOWED}"))
    async with gate_env.session(plan) as sandbox:
        servers.seen.clear()
        sent = request_bytes.encode().hex()
        result = await sandbox.exec(["python3", "-c", RAW_CLIENT, ALLOWED_IP, sent], timeout=30)
        assert result.returncode == 0, result.stderr
        assert f"host:{FRONTED}" not in servers.seen, (label, servers.seen, result.stdout)
        assert FRONTED not in result.stdout, label


async def held(sandbox: EnvironmentSession, label: str, *args: str) -> str:
    """HELD_CLIENT's report, run to its end."""
    result = await sandbox.exec(["python3", "-c", HELD_CLIENT, label, *args], timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


async def switch_while_held(
    sandbox: EnvironmentSession, flows: dict[str, tuple[str, ...]], policy: str
) -> dict[str, str]:
    """Each of `flows` (label: HELD_CLIENT's arguments) opened and answered once, then
    `policy` switched to, then each flow's report of what it still carried."""
    reports: dict[str, str] = {}

    async def run(label: str, args: tuple[str, ...]) -> None:
        reports[label] = await held(sandbox, label, *args)

    async with anyio.create_task_group() as group:
        for label, args in flows.items():
            group.start_soon(run, label, args)
        opened = " && ".join(f"[ -e /tmp/held-{label} ]" for label in flows)
        waited = await sandbox.exec(
            ["sh", "-c", f"until {opened}; do sleep 0.05; done"], timeout=60
        )
        assert waited.returncode == 0, waited
        await sandbox.set_network_policy(policy)
        await sandbox.exec(["touch", *(f"/tmp/switched-{label}" for label in flows)])
    return reports


async def test_a_switch_cuts_an_open_tls_flow_for_a_name_it_drops(
    gate_env: DockerEnvironment, servers: Servers, ca: tuple[Path, Path, Path]
) -> None:
    """Issue 40, item 4: two names on one address, a TLS flow open for each; a switch to
    a policy that allows only the other name cuts the first before it returns, and
    leaves the other's flow (its name still allowed) open."""
    both = f"allowlist:{ALLOWED},{OTHER}"
    plan = ExecutionPlan(image=TEST_IMAGE, network=NetworkSchedule(baseline=both))
    async with gate_env.session(plan) as sandbox:
        await sandbox.write_text(CA_IN_SANDBOX, ca[0].read_text())
        flows = {
            "dropped": (ALLOWED_IP, "443", ALLOWED, CA_IN_SANDBOX),
            "kept": (ALLOWED_IP, "443", OTHER, CA_IN_SANDBOX),
        }
        reports = await switch_while_held(sandbox, flows, f"allowlist:{OTHER}")
        assert reports["dropped"].endswith("carried 0"), reports
        assert reports["kept"] == "carried 10", reports
        # and a new connection for the dropped name is refused
        fresh = await client(sandbox, "tls", ALLOWED_IP, ALLOWED, CA_IN_SANDBOX)
        assert fresh.startswith("refused"), fresh


async def test_a_switch_cuts_an_open_tcp_flow_to_an_address_it_drops(
    gate_env: DockerEnvironment, servers: Servers
) -> None:
    plan = ExecutionPlan(
        image=TEST_IMAGE, network=NetworkSchedule(baseline=f"allowlist:{ALLOWED_IP}:{ECHO_PORT}")
    )
    async with gate_env.session(plan) as sandbox:
        flows = {"echo": (ALLOWED_IP, str(ECHO_PORT), "", "")}
        reports = await switch_while_held(sandbox, flows, f"allowlist:{DENIED_IP}:{TCP_PORT}")
        assert reports["echo"].endswith("carried 0"), reports
