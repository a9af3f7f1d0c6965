"""The Engine API connection: blocking docker-py calls in worker threads, retried when
the failure is transient and the call idempotent."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import docker
import requests
from docker.errors import APIError, DockerException

from corral.core.blocking import run_blocking, run_idempotent
from corral.errors import ProviderError
from corral.providers.docker.config import DockerConfig

#: docker-py is only partly typed; its clients are handled as Any at this one boundary.
Engine = Any

P = ParamSpec("P")
T = TypeVar("T")


def connect(config: DockerConfig) -> Engine:
    """A client from the config, else from DOCKER_HOST/DOCKER_TLS_VERIFY/DOCKER_CERT_PATH."""
    try:
        if config.base_url is None and config.tls_cert_path is None:
            client: Engine = docker.DockerClient.from_env(
                timeout=int(config.api_timeout_s), max_pool_size=config.max_workers
            )
        else:
            tls: Any = False
            if config.tls_cert_path is not None or config.tls_verify:
                path = config.tls_cert_path or ""
                tls = docker.tls.TLSConfig(
                    client_cert=(f"{path}/cert.pem", f"{path}/key.pem"),
                    ca_cert=f"{path}/ca.pem",
                    verify=bool(config.tls_verify),
                )
            client = docker.DockerClient(
                base_url=config.base_url,
                tls=tls,
                timeout=int(config.api_timeout_s),
                max_pool_size=config.max_workers,
            )
    except DockerException as exc:
        where = config.base_url or os.environ.get("DOCKER_HOST") or "the local socket"
        raise ProviderError(f"cannot reach the Docker Engine at {where}: {exc}") from None
    return client


class Hijacked:
    """An exec's stream after the engine's HTTP upgrade (`exec_start(socket=True)`): the
    one place corral reaches into docker-py's objects for it."""

    def __init__(self, raw: Any) -> None:
        self.sock: socket.socket = getattr(raw, "_sock", raw)
        response = getattr(raw, "_response", None)
        #: http.client's buffered reader over the socket: it may hold bytes read along with
        #: the upgrade's headers (None: read the socket)
        self.reader: Any = response.raw._fp.fp if response is not None else None

    def close(self) -> None:
        """Close the socket and the reader on it: the descriptor is freed now (the
        reader's reference alone kept it open until the response was collected)."""
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.reader is not None:
            with contextlib.suppress(OSError, ValueError):
                self.reader.close()


async def open_stream(api: Engine, tokens: int, container: str, argv: list[str]) -> Hijacked:
    """`argv` started in `container` as root from `/`, its stdin, stdout and stderr one
    engine stream (APIError or ProviderError when the engine refuses it)."""
    created: dict[str, Any] = await call(
        tokens,
        api.exec_create,
        container,
        argv,
        stdin=True,
        stdout=True,
        stderr=True,
        user="0",
        workdir="/",
    )
    return Hijacked(await call(tokens, api.exec_start, created["Id"], socket=True))


def transient(exc: BaseException) -> bool:
    """Connection resets and 5xx/429 from the engine; never 4xx answers."""
    if isinstance(exc, requests.ConnectionError | requests.Timeout):
        return True
    if isinstance(exc, APIError) and exc.status_code is not None:
        return exc.status_code == 429 or (exc.status_code >= 500 and "No such" not in str(exc))
    return False


async def call(tokens: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run one blocking Engine API call in a worker thread (never on the event loop)."""
    try:
        return await run_blocking("docker", tokens, fn, *args, **kwargs)
    except APIError:
        raise
    except requests.RequestException as exc:
        raise _lost(fn, exc) from None


async def idempotent(tokens: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`call`, retried on transient engine errors; only for calls safe to repeat."""
    try:
        return await run_idempotent(transient, "docker", tokens, fn, *args, **kwargs)
    except APIError:
        raise
    except requests.RequestException as exc:
        raise _lost(fn, exc) from None


def _lost(fn: Callable[..., object], exc: requests.RequestException) -> ProviderError:
    # The engine's own answers (APIError, an HTTPError too) are left to the callers, which
    # know what a 404 or 409 means there; a connection that broke or timed out means
    # nothing but itself.
    name = getattr(fn, "__name__", repr(fn))
    return ProviderError(f"Docker Engine call {name} failed: {exc}")
