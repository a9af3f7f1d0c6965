"""corral's credential proxy (`corral.core.credentials`): plain HTTP in from the sandbox,
TLS out to a route's upstream with the route's headers added.

It runs in the harness's process, on a thread and event loop of its own (a session's
life spans calls from any task), bound to an address that only the session's sandbox is
let reach (its provider adds an accept for it to every policy). What arrives is the
sandbox's and read as hostile input (h11: bounded request heads, one request per
connection). A request must come from the sandbox's address, carry the session's token
and name a route that serves in the phase in force. The response streams back as it
comes (a model API's server-sent events arrive in pieces), with every form of every
header value of the route struck out of its headers and body (`corral.core.secretforms`);
the upstream is asked for an unencoded body, a gzip or deflate one is decoded to be
struck, and any other encoding is refused, so no compression hides one.

What one sandbox can make the proxy spend is its session's `ProxyBudget`: connections
at once, a head's bytes and time, a body's bytes, a connection's time. Over it, a
connection is closed and one warning names the budget; the listener outlives the
harness running out of descriptors, so the route serves again when the flood ends.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import secrets
import ssl
import threading
import zlib
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio
import anyio.abc
import anyio.from_thread
import h11
from anyio.abc import SocketAttribute
from anyio.lowlevel import EventLoopToken, current_token

from corral.core.credentials import CredentialRoute, route_env_name
from corral.core.logs import event
from corral.core.secretforms import Redactor, SecretForms
from corral.network.policy import Phase

log = logging.getLogger("corral.credentials")

# One session's budget (SECURITY.md): a sandbox that spends it loses only its own route.
#: connections served at once; one more is accepted and closed at once (each is one
#: descriptor from the sandbox and at most one to the upstream, in the harness's process)
MAX_CONNECTIONS = 32
#: bytes a request's head may take (the request line and headers)
MAX_HEAD = 64 * 1024
#: seconds the sandbox has to send a request's whole head, and at most between two
#: pieces of its body
HEAD_TIMEOUT_S = 10.0
#: bytes of a request's body
MAX_BODY = 64 * 1024 * 1024
#: bytes a gzip or deflate response may decode to
MAX_DECODED = 256 * 1024 * 1024
#: seconds one connection lasts at most, head to the response's end
MAX_CONNECTION_S = 3600.0
#: seconds to reach the upstream, and to wait for its next bytes
CONNECT_TIMEOUT_S = 30.0
IDLE_TIMEOUT_S = 600.0
#: seconds the listener pauses when the harness's process is out of descriptors
ACCEPT_PAUSE_S = 0.1
#: seconds the listener pauses after closing a connection over the budget (at most 100
#: a second, whatever the sandbox dials)
OVER_PAUSE_S = 0.01
#: seconds `close` waits for the proxy's thread
CLOSE_WAIT_S = 5.0
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
#: and back: the body comes decoded, its encoding is no longer true
_DROPPED_BACK = _DROPPED | {"content-encoding"}
#: the Content-Encodings corral decodes to search; any other is refused (502)
_DECODABLE = {b"identity", b"gzip", b"x-gzip", b"deflate"}
#: zlib's window bits for "a zlib or gzip header, whichever it is"
_ZLIB_OR_GZIP = 32 + zlib.MAX_WBITS
#: bytes decoded at once (what a compressed body costs the harness's memory)
_DECODED_PIECE = 1024 * 1024


@dataclass(frozen=True)
class ProxyBudget:
    """What one session's proxy spends at most; the defaults are the module's constants
    (tests pass smaller ones)."""

    connections: int = MAX_CONNECTIONS
    head_bytes: int = MAX_HEAD
    head_timeout_s: float = HEAD_TIMEOUT_S
    body_bytes: int = MAX_BODY
    decoded_bytes: int = MAX_DECODED
    connection_s: float = MAX_CONNECTION_S
    idle_s: float = IDLE_TIMEOUT_S


class OverBudget(Exception):
    """A connection spent a part of its session's `ProxyBudget` (named by `budget`)."""

    def __init__(self, budget: str, message: str) -> None:
        super().__init__(message)
        self.budget = budget


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
        budget: ProxyBudget | None = None,
    ) -> None:
        self.routes = dict(routes)
        self.host = host
        self._peers = frozenset(peers)
        self._phase = phase
        self.sandbox_id = sandbox_id
        self.budget = budget or ProxyBudget()
        self._token = secrets.token_urlsafe(24)
        self.port = 0
        self._forms = SecretForms(s for route in self.routes.values() for s in route.secrets())
        self._open = 0
        self._warned: set[str] = set()
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
            for one in listener.listeners:
                if isinstance(one, anyio.abc.SocketListener):
                    group.start_soon(self._accept, one, group)

    async def _accept(self, listener: anyio.abc.SocketListener, group: anyio.abc.TaskGroup) -> None:
        """anyio's `serve` ends at the first failed accept; this loop outlives the
        harness running out of descriptors, and closes what is over the budget at once."""
        while True:
            try:
                client = await listener.accept()
            except OSError as exc:
                self._over("descriptors", f"the harness's process could not accept: {exc}")
                await anyio.sleep(ACCEPT_PAUSE_S)
                continue
            if self._open >= self.budget.connections:
                self._over("connections", f"{self.budget.connections} connections at once")
                await client.aclose()
                # A flood that reconnects as fast as it is closed would spend the harness's
                # CPU: over the budget, this session's proxy closes at most one a pause.
                await anyio.sleep(OVER_PAUSE_S)
                continue
            self._open += 1
            group.start_soon(self._handle, client)

    def _over(self, budget: str, message: str) -> None:
        """Warns of a spent budget once per session (a flood would flood the log)."""
        if budget not in self._warned:
            self._warned.add(budget)
            event(
                log,
                "warning",
                "credential proxy over its budget",
                sandbox=self.sandbox_id,
                budget=budget,
                detail=message,
            )

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        try:
            async with client:
                with anyio.fail_after(self.budget.connection_s):
                    await self._exchange(client)
        except OverBudget as exc:
            self._over(exc.budget, str(exc))
        except (h11.ProtocolError, OSError, anyio.BrokenResourceError, TimeoutError) as exc:
            event(
                log,
                "debug",
                "credential request failed",
                sandbox=self.sandbox_id,
                error=type(exc).__name__,
            )
        finally:
            self._open -= 1

    async def _exchange(self, client: anyio.abc.SocketStream) -> None:
        peer = str(client.extra(SocketAttribute.remote_address)[0])
        if peer not in self._peers:
            return  # not the sandbox: nothing is said to it
        server = h11.Connection(h11.SERVER, max_incomplete_event_size=self.budget.head_bytes)
        try:
            with anyio.fail_after(self.budget.head_timeout_s):
                request = await _next(server, client)
        except TimeoutError:
            raise OverBudget(
                "head_timeout_s", f"no whole request head in {self.budget.head_timeout_s} s"
            ) from None
        except h11.RemoteProtocolError as exc:
            if exc.error_status_hint != 431:  # h11's "head too long"
                raise
            raise OverBudget(
                "head_bytes", f"a request head over {self.budget.head_bytes} bytes"
            ) from None
        if isinstance(request, h11.Request):
            await self._answer(request, server, client)

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
        length = dict(request.headers).get(b"content-length", b"0")
        if int(length) > self.budget.body_bytes:
            await _reply(
                server, client, 413, f"a body over {self.budget.body_bytes} bytes\n".encode()
            )
            return
        url = f"{route.upstream}/{rest}" + (f"?{query}" if query else "")
        exchange = _Exchange(server, client, Redactor(self._forms), self.budget)
        await _forward(route, url, request, exchange)


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


@dataclass
class _Exchange:
    """The sandbox's side of one request: its connection, and what bounds and redacts
    what goes back to it."""

    server: h11.Connection
    client: anyio.abc.SocketStream
    redactor: Redactor
    budget: ProxyBudget

    async def send(self, event: h11.Event) -> None:
        await self.client.send(self.server.send(event) or b"")


async def _forward(
    route: CredentialRoute, url: str, request: h11.Request, exchange: _Exchange
) -> None:
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or 443
    context = ssl.create_default_context(cafile=route.ca_file)
    try:
        with anyio.fail_after(CONNECT_TIMEOUT_S):
            upstream = await anyio.connect_tcp(host, port, ssl_context=context, tls_hostname=host)
    except (OSError, TimeoutError, ssl.SSLError) as exc:
        await _reply(
            exchange.server,
            exchange.client,
            502,
            f"the upstream did not answer: {type(exc).__name__}\n".encode(),
        )
        return
    try:
        up = h11.Connection(h11.CLIENT)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        head = h11.Request(
            method=request.method,
            target=target or "/",
            headers=_request_headers(route, request, parts.netloc),
        )
        await upstream.send(up.send(head) or b"")
        await _relay_request_body(exchange, up, upstream)
        await _relay_response(up, upstream, exchange)
    finally:
        # Not TLS's orderly close: its failure would hide why the exchange ended.
        await anyio.aclose_forcefully(upstream)


async def _relay_request_body(
    exchange: _Exchange, up: h11.Connection, upstream: anyio.abc.ByteStream
) -> None:
    """The sandbox's request body to the upstream, as it comes, within the budget."""
    budget, sent = exchange.budget, 0
    while True:
        with anyio.fail_after(budget.head_timeout_s):
            part = await _next(exchange.server, exchange.client)
        if not isinstance(part, h11.Data):
            await upstream.send(up.send(h11.EndOfMessage()) or b"")
            return
        sent += len(part.data)
        if sent > budget.body_bytes:
            raise OverBudget("body_bytes", f"a request body over {budget.body_bytes} bytes")
        await upstream.send(up.send(h11.Data(data=part.data)) or b"")


async def _relay_response(
    up: h11.Connection, upstream: anyio.abc.ByteStream, exchange: _Exchange
) -> None:
    """The upstream's answer back to the sandbox piece by piece, every form of the
    route's header values struck out of its headers and (decoded) body."""
    with anyio.fail_after(exchange.budget.idle_s):
        answer = await _next(up, upstream)
    if not isinstance(answer, h11.Response):
        await _reply(exchange.server, exchange.client, 502, b"the upstream's answer was not HTTP\n")
        return
    coding = dict(answer.headers).get(b"content-encoding", b"identity").strip().lower()
    if coding not in _DECODABLE:
        message = (
            f"the upstream's answer is {coding.decode('latin-1')!r}-encoded, which corral "
            "cannot search for the route's keys\n"
        )
        await _reply(exchange.server, exchange.client, 502, message.encode())
        return
    decode = _Decoder(coding, exchange.budget.decoded_bytes)
    headers = _response_headers(answer, exchange.redactor)
    await exchange.send(h11.Response(status_code=answer.status_code, headers=headers))
    while True:
        with anyio.fail_after(exchange.budget.idle_s):
            part = await _next(up, upstream)
        if not isinstance(part, h11.Data):
            break
        for piece in decode(bytes(part.data)):
            await _send_data(exchange, exchange.redactor.feed(piece))
    await _send_data(exchange, exchange.redactor.flush())
    await exchange.send(h11.EndOfMessage())


def _response_headers(answer: h11.Response, redactor: Redactor) -> list[tuple[bytes, bytes]]:
    """The answer's headers with every form struck from their values; a header whose
    name holds one is left out (a name cannot carry the mark)."""
    return [
        (k, redactor.strike(v))
        for k, v in answer.headers
        if k.decode("latin-1") not in _DROPPED_BACK and redactor.strike(k) == k
    ]


async def _send_data(exchange: _Exchange, data: bytes) -> None:
    if data:
        await exchange.send(h11.Data(data=data))


class _Decoder:
    """An answer's body as sent (identity) or decoded (gzip, deflate) in pieces of at
    most `_DECODED_PIECE` bytes, never more than `limit` bytes in all: a small body that
    inflates past it ends the connection, and none is held whole."""

    def __init__(self, coding: bytes, limit: int) -> None:
        self._zlib = None if coding == b"identity" else zlib.decompressobj(wbits=_ZLIB_OR_GZIP)
        self._left = limit

    def __call__(self, data: bytes) -> Iterator[bytes]:
        if self._zlib is None:
            yield data
            return
        while True:
            try:
                out = self._zlib.decompress(data, _DECODED_PIECE)
            except zlib.error as exc:
                raise OverBudget("decoded_bytes", f"a body that does not decode: {exc}") from None
            self._left -= len(out)
            if self._left < 0:
                raise OverBudget("decoded_bytes", "a response body that decodes past the budget")
            yield out
            data = self._zlib.unconsumed_tail
            if not data and len(out) < _DECODED_PIECE:
                return
