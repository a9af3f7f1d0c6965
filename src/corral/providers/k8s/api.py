"""The API server connection: blocking client calls in worker threads, retried only on
transient errors (429, 5xx, connection reset) of idempotent calls."""

from __future__ import annotations

import importlib
import json
import threading
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import urllib3
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from corral.core.blocking import run_blocking, run_idempotent, run_stoppable
from corral.errors import ProviderError
from corral.providers.k8s.config import KubernetesConfig

P = ParamSpec("P")
T = TypeVar("T")

#: The kubernetes client is only partly typed; its objects are Any at this one boundary.
Api = Any
k8s: Api = importlib.import_module("kubernetes.client")
k8s_config: Api = importlib.import_module("kubernetes.config")

REQUEST_TIMEOUT = (5, 60)


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
    return Clients(k8s.CoreV1Api(api_client), k8s.NetworkingV1Api(api_client), configuration)


class Clients:
    def __init__(self, core: Api, networking: Api, configuration: Api) -> None:
        self.core = core
        self.networking = networking
        self.configuration = configuration
        self.host: str = configuration.host
        self._local = threading.local()

    def streaming(self) -> Api:
        """A CoreV1Api for exec/port-forward websockets, one per worker thread.

        `kubernetes.stream` swaps its ApiClient's `request` for the websocket call while
        it connects; on a shared client a REST call from another thread at that moment
        would go out as a websocket handshake. A client per thread cannot race.
        """
        core: Api | None = getattr(self._local, "core", None)
        if core is None:
            core = k8s.CoreV1Api(k8s.ApiClient(self.configuration))
            self._local.core = core
        return core


def status_of(exc: ApiException) -> int:
    value: Any = getattr(exc, "status", 0)
    return int(value or 0)


def transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return status_of(exc) == 429 or status_of(exc) >= 500
    return isinstance(exc, urllib3.exceptions.ProtocolError | ConnectionResetError)


async def call(tokens: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    return await run_blocking("k8s", tokens, fn, *args, **kwargs)


async def stoppable(tokens: int, fn: Callable[[threading.Event], T]) -> T:
    return await run_stoppable("k8s", tokens, fn)


async def idempotent(tokens: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    return await run_idempotent(transient, "k8s", tokens, fn, *args, **kwargs)


def explain(exc: ApiException) -> str:
    """The API server's own message, not the whole HTTP dump."""
    raw: Any = getattr(exc, "body", None)
    reason: Any = getattr(exc, "reason", None)
    try:
        body: dict[str, Any] = json.loads(raw or "{}")
    except ValueError:
        body = {}
    return str(body.get("message") or reason or exc)
