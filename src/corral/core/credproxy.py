"""corral's credential proxy (`corral.core.credentials`): plain HTTP in from the sandbox,
TLS out to a route's upstream with the route's headers added.

It runs in the harness's process, on a thread and event loop of its own (a session's
life spans calls from any task), bound to an address that only the session's sandbox is
let reach (its provider adds an accept for it to every policy). What arrives is the
sandbox's and read as hostile input (h11: bounded request heads, one request per
connection). A request must come from the sandbox's address, carry the session's token
and name a route that serves in the phase in force. The response streams back as it
comes (a model API's server-sent events arrive in pieces), with every header value of
the route struck out of its headers and body; the upstream is asked for an unencoded
body, so no compression hides one.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import secrets
import ssl
import threading
from collections.abc import Callable, Collection, Mapping
from urllib.parse import urlsplit

import anyio
import anyio.abc
import anyio.from_thread
import h11
from anyio.abc import SocketAttribute
from anyio.lowlevel import EventLoopToken, current_token

from corral.core.credentials import CredentialRoute, route_env_name
from corral.core.logs import event
from corral.network.policy import Phase

log = logging.getLogger("corral.credentials")

#: bytes a request's head may take (the request line and headers)
MAX_HEAD = 64 * 1024
#: seconds to reach the upstream, and to wait for its next bytes
CONNECT_TIMEOUT_S = 30.0
IDLE_TIMEOUT_S = 600.0
#: seconds `close` waits for the proxy's thread
CLOSE_WAIT_S = 5.0
REDACTED = b"[redacted by corral]"
#: headers not passed on: hop-by-hop ones, and those the proxy sets itself
_DROPPED = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "accept-encoding",
    "content-length",
}


class Redactor:
    """Strikes `secrets` out of a stream of chunks, holding back only a tail that could
    be the start of one (so a stream's pieces come through as they come)."""

    def __init__(self, secrets: Collection[bytes]) -> None:
        self._secrets = [s for s in secrets if s]
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self.strike(self._held + chunk)
        keep = self._partial_tail(data)
        self._held = data[len(data) - keep :] if keep else b""
        return data[: len(data) - keep]

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return held

    def strike(self, data: bytes) -> bytes:
        """`data` with every secret in it replaced."""
        for secret in self._secrets:
            data = data.replace(secret, REDACTED)
        return data

    def _partial_tail(self, data: bytes) -> int:
        """The length of the longest end of `data` that begins one of the secrets."""
        longest = 0
        for secret in self._secrets:
            for size in range(min(len(secret) - 1, len(data)), longest, -1):
                if data.endswith(secret[:size]):
                    longest = size
                    break
        return longest


class CredentialProxy:
    """The proxy of one session's routes, on its own thread: `start()` once (blocking),
    `close()` when the session ends."""

    def __init__(
        self,
        routes: Mapping[str, CredentialRoute],
        *,
        host: str,
        peers: Collection[str],
        phase: Callable[[], Phase | None],
        sandbox_id: str,
    ) -> None:
        self.routes = dict(routes)
        self.host = host
        self._peers = frozenset(peers)
        self._phase = phase
        self.sandbox_id = sandbox_id
        self._token = secrets.token_urlsafe(24)
        self.port = 0
        self._secrets = [s for route in self.routes.values() for s in route.secrets()]
        self._thread: threading.Thread | None = None
        self._loop: EventLoopToken | None = None
        self._scope: anyio.CancelScope | None = None
        self._ready = threading.Event()
        self._failed: BaseException | None = None

    def env(self) -> dict[str, str]:
        """What the sandbox gets: each route's base URL (no secret in it)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return {
            route_env_name(name): f"http://{host}:{self.port}/{self._token}/{name}"
            for name in self.routes
        }

    def start(self) -> None:
        """Bind and serve (blocking: call it from a worker thread)."""
        self._thread = threading.Thread(
            target=self._run, name=f"corral-credentials-{self.sandbox_id}", daemon=True
        )
        self._thread.start()
        self._ready.wait(CONNECT_TIMEOUT_S)
        if self._failed is not None or not self.port:
            self.close()
            raise OSError(f"corral's credential proxy did not start on {self.host}: {self._failed}")

    def close(self) -> None:
        """Stop serving and wait (bounded) for the thread; idempotent, blocking."""
        loop, scope = self._loop, self._scope
        if loop is not None and scope is not None:
            with contextlib.suppress(RuntimeError):
                anyio.from_thread.run_sync(scope.cancel, token=loop)
        if self._thread is not None:
            self._thread.join(CLOSE_WAIT_S)

    def _run(self) -> None:
        try:
            anyio.run(self._serve)
        except BaseException as exc:  # the thread's end: recorded for `start`
            self._failed = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        listener = await anyio.create_tcp_listener(local_host=self.host, local_port=0)
        async with listener, anyio.create_task_group() as group:
            self.port = int(listener.extra(SocketAttribute.local_port))
            self._loop, self._scope = current_token(), group.cancel_scope
            self._ready.set()
            await listener.serve(self._handle, task_group=group)

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        async with client:
            peer = str(client.extra(SocketAttribute.remote_address)[0])
            if peer not in self._peers:
                return  # not the sandbox: nothing is said to it
            server = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
            try:
                with anyio.fail_after(IDLE_TIMEOUT_S):
                    request = await _next(server, client)
                if not isinstance(request, h11.Request):
                    return
                await self._answer(request, server, client)
            except (h11.ProtocolError, OSError, anyio.BrokenResourceError, TimeoutError) as exc:
                event(
                    log,
                    "debug",
                    "credential request failed",
                    sandbox=self.sandbox_id,
                    error=type(exc).__name__,
                )

    async def _answer(
        self, request: h11.Request, server: h11.Connection, client: anyio.abc.SocketStream
    ) -> None:
        target = request.target.decode("latin-1")
        path, _, query = target.partition("?")
        _, token, name, rest = [*path.split("/", 3), "", ""][:4]
        route = self.routes.get(name)
        if not hmac.compare_digest(token, self._token) or route is None:
            await _reply(server, client, 404, b"no such credential route\n")
            return
        phase = self._phase()
        if not route.serves_in(phase):
            await _reply(
                server, client, 403, f"route {name!r} does not serve in phase {phase}\n".encode()
            )
            return
        event(
            log, "info", "credential route used", sandbox=self.sandbox_id, route=name, phase=phase
        )
        url = f"{route.upstream}/{rest}" + (f"?{query}" if query else "")
        await _forward(route, url, request, server, client, Redactor(self._secrets))


async def _next(conn: h11.Connection, stream: anyio.abc.ByteStream) -> object:
    while True:
        found = conn.next_event()
        if found is not h11.NEED_DATA:
            return found
        try:
            data = await stream.receive(65536)
        except anyio.EndOfStream:
            data = b""
        conn.receive_data(data)


async def _reply(
    server: h11.Connection, client: anyio.abc.SocketStream, status: int, body: bytes
) -> None:
    headers = [("content-type", "text/plain"), ("content-length", str(len(body)))]
    await client.send(server.send(h11.Response(status_code=status, headers=headers)) or b"")
    await client.send(server.send(h11.Data(data=body)) or b"")
    await client.send(server.send(h11.EndOfMessage()) or b"")


def _request_headers(
    route: CredentialRoute, request: h11.Request, netloc: str
) -> list[tuple[str, str]]:
    given = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers]
    added = {name.lower() for name in route.headers}
    headers = [(k, v) for k, v in given if k.lower() not in _DROPPED | added]
    framing = {
        k.lower(): v for k, v in given if k.lower() in ("content-length", "transfer-encoding")
    }
    if "transfer-encoding" in framing:
        headers.append(("transfer-encoding", "chunked"))
    elif "content-length" in framing:
        headers.append(("content-length", framing["content-length"]))
    headers += [("host", netloc), ("accept-encoding", "identity"), ("connection", "close")]
    return headers + [(k, v.get_secret_value()) for k, v in route.headers.items()]


async def _forward(
    route: CredentialRoute,
    url: str,
    request: h11.Request,
    server: h11.Connection,
    client: anyio.abc.SocketStream,
    redactor: Redactor,
) -> None:
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 443
    context = ssl.create_default_context(cafile=route.ca_file)
    try:
        with anyio.fail_after(CONNECT_TIMEOUT_S):
            upstream = await anyio.connect_tcp(host, port, ssl_context=context, tls_hostname=host)
    except (OSError, TimeoutError, ssl.SSLError) as exc:
        await _reply(
            server, client, 502, f"the upstream did not answer: {type(exc).__name__}\n".encode()
        )
        return
    async with upstream:
        up = h11.Connection(h11.CLIENT)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        head = h11.Request(
            method=request.method,
            target=target or "/",
            headers=_request_headers(route, request, parts.netloc),
        )
        await upstream.send(up.send(head) or b"")
        await _relay_request_body(server, client, up, upstream)
        await _relay_response(up, upstream, server, client, redactor)


async def _relay_request_body(
    server: h11.Connection,
    client: anyio.abc.SocketStream,
    up: h11.Connection,
    upstream: anyio.abc.ByteStream,
) -> None:
    """The sandbox's request body to the upstream, as it comes."""
    while True:
        with anyio.fail_after(IDLE_TIMEOUT_S):
            part = await _next(server, client)
        if isinstance(part, h11.Data):
            await upstream.send(up.send(h11.Data(data=part.data)) or b"")
        else:
            await upstream.send(up.send(h11.EndOfMessage()) or b"")
            return


async def _relay_response(
    up: h11.Connection,
    upstream: anyio.abc.ByteStream,
    server: h11.Connection,
    client: anyio.abc.SocketStream,
    redactor: Redactor,
) -> None:
    """The upstream's answer back to the sandbox piece by piece, the route's header
    values struck out of its headers and body."""
    with anyio.fail_after(IDLE_TIMEOUT_S):
        answer = await _next(up, upstream)
    if not isinstance(answer, h11.Response):
        await _reply(server, client, 502, b"the upstream's answer was not HTTP\n")
        return
    headers = [
        (k, redactor.strike(v))
        for k, v in answer.headers
        if k.decode("latin-1").lower() not in _DROPPED
    ]
    await client.send(
        server.send(h11.Response(status_code=answer.status_code, headers=headers)) or b""
    )
    while True:
        with anyio.fail_after(IDLE_TIMEOUT_S):
            part = await _next(up, upstream)
        if not isinstance(part, h11.Data):
            break
        piece = redactor.feed(bytes(part.data))
        if piece:
            await client.send(server.send(h11.Data(data=piece)) or b"")
    tail = redactor.flush()
    if tail:
        await client.send(server.send(h11.Data(data=tail)) or b"")
    await client.send(server.send(h11.EndOfMessage()) or b"")
