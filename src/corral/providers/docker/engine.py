"""The Engine API connection (`Engine`): blocking docker-py calls in worker threads,
retried when the failure is transient and the call idempotent. The one place corral
touches docker-py's objects beyond their public calls (`Hijacked`)."""

from __future__ import annotations

import base64
import contextlib
import json
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

#: docker-py is only partly typed; its objects are handled as Any at this one boundary.
Raw = Any

P = ParamSpec("P")
T = TypeVar("T")


def connect(config: DockerConfig) -> Raw:
    """A client from the config, else from DOCKER_HOST/DOCKER_TLS_VERIFY/DOCKER_CERT_PATH."""
    try:
        if config.base_url is None and config.tls_cert_path is None:
            client: Raw = docker.DockerClient.from_env(
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


class Engine:
    """docker-py's client, every call of it made in a worker thread under one limiter of
    `tokens` threads (the config's `max_workers`, shared by the process's environments of
    that size). One per environment, closed with it."""

    def __init__(self, client: Raw, tokens: int) -> None:
        #: docker.DockerClient, for its image calls (pull, build)
        self.client: Raw = client
        #: docker.APIClient: every other call
        self.api: Raw = client.api
        self.tokens = tokens

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run one blocking Engine API call in a worker thread (never on the event loop)."""
        try:
            return await run_blocking("docker", self.tokens, fn, *args, **kwargs)
        except APIError:
            raise
        except requests.RequestException as exc:
            raise _lost(fn, exc) from None

    async def idempotent(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`call`, retried on transient engine errors; only for calls safe to repeat."""
        try:
            return await run_idempotent(transient, "docker", self.tokens, fn, *args, **kwargs)
        except APIError:
            raise
        except requests.RequestException as exc:
            raise _lost(fn, exc) from None

    async def exec_stream(
        self,
        container: str,
        argv: list[str],
        *,
        stdin: bool,
        user: str,
        workdir: str | None,
        environment: dict[str, str] | None = None,
    ) -> tuple[str, Hijacked]:
        """`argv` started in `container`, its stdout and stderr (and stdin) one engine
        stream; with the exec's id (APIError or ProviderError when the engine refuses)."""
        created: dict[str, Any] = await self.call(
            self.api.exec_create,
            container,
            argv,
            stdin=stdin,
            stdout=True,
            stderr=True,
            environment=environment,
            workdir=workdir,
            user=user,
        )
        raw: Any = await self.call(self.api.exec_start, created["Id"], socket=True)
        return created["Id"], Hijacked(raw)

    async def open_stream(self, container: str, argv: list[str]) -> Hijacked:
        """One of corral's programs, `argv`, started in `container` as root from `/`, on a
        stream that waits for it as long as it runs: its reads have no timeout (the
        client's per-call one would end an exec channel, or an event reader, after that
        long without a word), and its owner ends it with a shutdown."""
        _, stream = await self.exec_stream(container, argv, stdin=True, user="0", workdir="/")
        stream.sock.settimeout(None)
        return stream

    def path_stat(self, container: str, path: str) -> dict[str, Any] | None:
        """The engine's stat of `path` in `container`, its last component not followed;
        None if missing (blocking: give it to `call`)."""
        # HEAD /containers/{id}/archive stats a path; docker-py has no call for it.
        url = self.api._url("/containers/{0}/archive", container)
        response = self.api.head(url, params={"path": path})
        if response.status_code == 404:
            return None
        self.api._raise_for_status(response)
        header = response.headers["X-Docker-Container-Path-Stat"]
        found: dict[str, Any] = json.loads(base64.b64decode(header))
        return found

    def close(self) -> None:
        self.client.close()


def transient(exc: BaseException) -> bool:
    """Connection resets and 5xx/429 from the engine; never 4xx answers."""
    if isinstance(exc, requests.ConnectionError | requests.Timeout):
        return True
    if isinstance(exc, APIError) and exc.status_code is not None:
        return exc.status_code == 429 or (exc.status_code >= 500 and "No such" not in str(exc))
    return False


def _lost(fn: Callable[..., object], exc: requests.RequestException) -> ProviderError:
    # The engine's own answers (APIError, an HTTPError too) are left to the callers, which
    # know what a 404 or 409 means there; a connection that broke or timed out means
    # nothing but itself.
    name = getattr(fn, "__name__", repr(fn))
    return ProviderError(f"Docker Engine call {name} failed: {exc}")
