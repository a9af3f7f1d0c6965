"""Opening an exec or port-forward websocket is bounded: an API server that accepts the
connection and never answers fails the call after `api_timeout_s` (the kubernetes
client's own handshake has no timeout and held a worker thread for good)."""

from __future__ import annotations

import socket
import time

import pytest

from corral.errors import ProviderError
from corral.providers.k8s.api import Clients, k8s


@pytest.mark.parametrize("scheme", ["https", "http"])
def test_a_silent_api_server_fails_the_websocket_after_the_timeout(scheme: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # listens, never accepts
        configuration = k8s.Configuration()
        configuration.host = f"{scheme}://127.0.0.1:{silent.getsockname()[1]}"
        configuration.verify_ssl = False
        clients = Clients(None, None, configuration, tokens=1, timeout_s=0.5)
        started = time.monotonic()
        with pytest.raises(ProviderError, match="connect_get_namespaced_pod_exec pod-1.*open"):
            clients.websocket(
                "connect_get_namespaced_pod_exec",
                "pod-1",
                "ns",
                command=["true"],
                stdout=True,
                _preload_content=False,
                binary=True,
            )
        assert time.monotonic() - started < 5


def test_a_refused_connection_fails_the_websocket_naming_the_call() -> None:
    with socket.create_server(("127.0.0.1", 0)) as gone:
        port = gone.getsockname()[1]
    configuration = k8s.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    clients = Clients(None, None, configuration, tokens=1, timeout_s=5)
    with pytest.raises(ProviderError, match="ConnectionRefusedError"):
        clients.websocket(
            "connect_get_namespaced_pod_portforward",
            "pod-1",
            "ns",
            ports="80",
            _preload_content=False,
            binary=True,
        )
