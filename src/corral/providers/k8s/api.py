"""The API server connection: blocking client calls in worker threads, each bounded by
`api_timeout_s`, retried only on transient errors (429, 5xx, a connection lost, refused or
timed out) of idempotent calls. A call that fails for any reason but a 4xx answer raises
`ProviderError` naming the call (`create Pod corral-…`); a 4xx is the caller's to read."""

from __future__ import annotations

import functools
import importlib
import json
import ssl
import threading
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar, cast

import certifi
import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from websocket import WebSocket, WebSocketException

from corral.core.blocking import run_blocking, run_idempotent, run_stoppable
from corral.errors import ProviderError
from corral.providers.k8s.config import KubernetesConfig

P = ParamSpec("P")
T = TypeVar("T")

#: The kubernetes client is only partly typed; its objects are Any at this one boundary.
Api = Any
k8s: Api = importlib.import_module("kubernetes.client")
k8s_config: Api = importlib.import_module("kubernetes.config")
ws_client: Api = importlib.import_module("kubernetes.stream.ws_client")
#: how `kubernetes.stream` runs a generated method over a websocket of the caller's making
_websocket_request: Api = vars(importlib.import_module("kubernetes.stream.stream"))[
    "_websocket_request"
]

#: Failures of the connection to the API server (not of local files).
TRANSPORT_ERRORS = (urllib3.exceptions.HTTPError, ConnectionError, TimeoutError, ssl.SSLError)
_VERBS = {"create", "read", "patch", "replace", "delete", "list"}


def connect(config: KubernetesConfig) -> Api:
    """A CoreV1/NetworkingV1 pair from the config (kubeconfig, context, or in-cluster)."""
    configuration = k8s.Configuration()
    try:
        if config.in_cluster:
            k8s_config.load_incluster_config(client_configuration=configuration)
        else:
            k8s_config.load_kube_config(
                config_file=config.kubeconfig,
                context=config.context,
                client_configuration=configuration,
            )
    except (ConfigException, OSError, TypeError) as exc:
        where = config.kubeconfig or "KUBECONFIG / ~/.kube/config"
        raise ProviderError(f"cannot load Kubernetes credentials from {where}: {exc}") from None
    configuration.retries = 1
    configuration.connection_pool_maxsize = config.max_workers
    api_client = k8s.ApiClient(configuration)
    api_client.rest_client.request = _bounded(api_client.rest_client.request, config.api_timeout_s)
    return Clients(
        k8s.CoreV1Api(api_client),
        k8s.NetworkingV1Api(api_client),
        configuration,
        config.max_workers,
        config.api_timeout_s,
    )


def _bounded(request: Callable[..., Any], timeout_s: float) -> Callable[..., Any]:
    """`request` with (connect, read) timeouts unless the call gives its own: the client
    has no default, and a silent API server would hold a worker thread for good."""

    def send(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_request_timeout") is None:
            kwargs["_request_timeout"] = (timeout_s, timeout_s)
        return request(*args, **kwargs)

    return send


class Clients:
    """The API server's clients, and `tokens`: at most that many of their blocking calls
    in worker threads at once (the config's `max_workers`)."""

    def __init__(
        self, core: Api, networking: Api, configuration: Api, tokens: int, timeout_s: float
    ) -> None:
        self.core = core
        self.networking = networking
        self.configuration = configuration
        self.tokens = tokens
        #: how long a websocket's connect, TLS and upgrade may take (`api_timeout_s`)
        self.timeout_s = timeout_s
        self.host: str = configuration.host
        self._local = threading.local()

    def websocket(self, method: str, *args: Any, **kwargs: Any) -> WebSocket:
        """The streaming websocket (exec, port-forward) of CoreV1Api's `method`, its
        handshake done and nothing read yet (blocking). The request is built by the
        kubernetes client (URL, query, credentials); the connection here, because the
        client's own has no timeout at all and waits for good on an API server that
        accepts and never answers. Raises ProviderError if it cannot be opened."""
        # The generated method only builds the request: `kubernetes.stream` swaps its
        # ApiClient's call for the websocket's while it runs, so a client per thread (a
        # REST call from another thread at that moment would go out as a handshake).
        core: Api | None = getattr(self._local, "core", None)
        if core is None:
            core = k8s.CoreV1Api(k8s.ApiClient(self.configuration))
            self._local.core = core
        handshake = functools.partial(_handshake, timeout_s=self.timeout_s)
        try:
            ws: WebSocket = _websocket_request(
                handshake, None, getattr(core, method), *args, **kwargs
            )
            return ws
        except (WebSocketException, *TRANSPORT_ERRORS, OSError) as exc:
            raise ProviderError(
                f"{method} {args[0] if args else ''}: the websocket to the API server could "
                f"not be opened ({type(exc).__name__}: {exc})"
            ) from None


def _handshake(
    configuration: Api, _method: str, url: str, *, timeout_s: float, **kwargs: Any
) -> WebSocket:
    """The kubernetes client's websocket options (`ws_client.create_websocket`), with a
    timeout on the connect, TLS and upgrade; afterwards the socket blocks again, and each
    caller sets its own waits."""
    headers: dict[str, str] = kwargs.get("headers") or {}
    header: list[str] = []
    if "authorization" in headers:
        header.append(f"authorization: {headers['authorization']}")
    if url.startswith("https") and configuration.verify_ssl:
        sslopt: dict[str, Any] = {
            "cert_reqs": ssl.CERT_REQUIRED,
            "ca_certs": configuration.ssl_ca_cert or certifi.where(),
        }
        if configuration.assert_hostname is not None:
            sslopt["check_hostname"] = configuration.assert_hostname
    else:
        sslopt = {"cert_reqs": ssl.CERT_NONE}
    for option, value in (
        ("certfile", configuration.cert_file),
        ("keyfile", configuration.key_file),
        ("server_hostname", configuration.tls_server_name),
    ):
        if value:
            sslopt[option] = value
    options: dict[str, Any] = {
        "header": header,
        # named as subprotocols (not a header) so that the one chosen is read back
        "subprotocols": [ws_client.V5_CHANNEL_PROTOCOL, ws_client.V4_CHANNEL_PROTOCOL],
        "timeout": timeout_s,
    }
    if configuration.proxy or configuration.proxy_headers:
        options = ws_client.websocket_proxycare(options, configuration, url, headers)
    ws: Api = WebSocket(sslopt=sslopt, skip_utf8_validation=False)
    ws.connect(ws_client.get_websocket_url(url, kwargs.get("query_params")), **options)
    ws.settimeout(None)
    return ws


def status_of(exc: ApiException) -> int:
    value: Any = getattr(exc, "status", 0)
    return int(value or 0)


def transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return status_of(exc) == 429 or status_of(exc) >= 500
    if isinstance(exc, urllib3.exceptions.MaxRetryError):
        return exc.reason is not None and transient(exc.reason)
    return isinstance(
        exc,
        urllib3.exceptions.ProtocolError
        | urllib3.exceptions.TimeoutError
        | urllib3.exceptions.NewConnectionError
        | ConnectionError
        | TimeoutError,
    )


def describe(fn: Callable[..., object], args: Sequence[object]) -> str:
    """The call in words: `create_namespaced_pod(ns, {metadata: {name: p}})` is
    `create Pod p`; `read_namespaced_service("kube-dns", "kube-system")` is
    `read Service kube-dns`."""
    name: str = getattr(fn, "__name__", repr(fn))
    verb, _, kind = name.partition("_")
    if verb not in _VERBS or not kind:
        return name
    kind = kind.removeprefix("namespaced_")
    words = [verb, "".join(w.capitalize() for w in kind.split("_"))]
    if verb == "create":
        bodies = [cast("dict[str, Any]", a) for a in args if isinstance(a, dict)]
        metadata: dict[str, Any] = (bodies[0].get("metadata") or {}) if bodies else {}
        if metadata.get("name"):
            words.append(str(metadata["name"]))
    elif verb != "list" and args and isinstance(args[0], str):
        words.append(args[0])
    return " ".join(words)


def failure(fn: Callable[..., object], args: Sequence[object], exc: BaseException) -> Exception:
    """What a failed call raises: a 4xx answer as it is, anything else a `ProviderError`
    that names the call."""
    if isinstance(exc, ApiException):
        status = status_of(exc)
        if 400 <= status < 500 and status != 429:
            return exc
        why = f"{status} {explain(exc)}" if status else explain(exc)
    else:
        why = f"{type(exc).__name__}: {exc}"
    return ProviderError(f"Kubernetes API call `{describe(fn, args)}` failed: {why}")


async def call(tokens: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    try:
        return await run_blocking("k8s", tokens, fn, *args, **kwargs)
    except (ApiException, *TRANSPORT_ERRORS) as exc:
        raise failure(fn, args, exc) from None


async def stoppable(tokens: int, fn: Callable[[threading.Event], T]) -> T:
    return await run_stoppable("k8s", tokens, fn)


async def idempotent(tokens: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    try:
        return await run_idempotent(transient, "k8s", tokens, fn, *args, **kwargs)
    except (ApiException, *TRANSPORT_ERRORS) as exc:
        raise failure(fn, args, exc) from None


def explain(exc: ApiException) -> str:
    """The API server's own message, not the whole HTTP dump."""
    raw: Any = getattr(exc, "body", None)
    reason: Any = getattr(exc, "reason", None)
    try:
        body: dict[str, Any] = json.loads(raw or "{}")
    except ValueError:
        body = {}
    return str(body.get("message") or reason or exc)
