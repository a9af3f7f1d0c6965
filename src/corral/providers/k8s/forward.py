"""`endpoint(port)`: a port-forward to 127.0.0.1 owned by the session.

A listener on a loopback port; each connection to it gets its own port-forward stream
to the Pod, pumped by a thread. `close()` (pushed onto the session's owned stack) stops
the listener and every open connection.
"""

from __future__ import annotations

import contextlib
import importlib
import selectors
import socket
import threading
from typing import Any

from corral.providers.k8s.api import Api

portforward: Api = importlib.import_module("kubernetes.stream").portforward


class PortForwarder:
    def __init__(self, clients: Api, namespace: str, pod: str, port: int) -> None:
        self.clients = clients
        self.namespace = namespace
        self.pod = pod
        self.remote_port = port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.server.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._accept, name=f"corral-forward-{pod}-{port}", daemon=True
        )
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with self._lock:
                self._open.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        forward: Any = None
        try:
            forward = portforward(
                self.clients.streaming().connect_get_namespaced_pod_portforward,
                self.pod,
                self.namespace,
                ports=str(self.remote_port),
            )
            _pump(conn, forward.socket(self.remote_port))
        except Exception:
            pass
        finally:
            with self._lock:
                self._open.discard(conn)
            conn.close()
            if forward is not None:
                forward.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        with self._lock:
            for conn in self._open:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)


def _pump(local: socket.socket, remote: Any) -> None:
    """Copy bytes both ways until either side closes."""
    selector = selectors.DefaultSelector()
    selector.register(local, selectors.EVENT_READ, remote)
    selector.register(remote, selectors.EVENT_READ, local)
    try:
        while True:
            for key, _ in selector.select():
                source: Any = key.fileobj
                data: bytes = source.recv(65536)
                if not data:
                    return
                key.data.sendall(data)
    finally:
        selector.close()
