"""`endpoint(port)`: a port-forward to 127.0.0.1 owned by the session.

A listener on a loopback port; each connection to it gets its own port-forward websocket
to the Pod, pumped by two threads (`websocket.WebSocketTransport`: epoll, never the
kubernetes client's `select()` proxy, which fails once the harness has 1024 descriptors).
`close()` (pushed onto the session's owned stack) stops the listener and every open
connection.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from corral.providers.k8s.api import Api
from corral.providers.k8s.websocket import IO_CHUNK, PORT_FORWARD, WebSocketTransport


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
        transport: WebSocketTransport | None = None
        try:
            ws = self.clients.websocket(
                "connect_get_namespaced_pod_portforward",
                self.pod,
                self.namespace,
                ports=str(self.remote_port),
                _preload_content=False,
                binary=True,
            )
            transport = WebSocketTransport(ws, PORT_FORWARD)
            _pump(conn, transport)
        except Exception:
            pass
        finally:
            with self._lock:
                self._open.discard(conn)
            conn.close()
            if transport is not None:
                transport.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        with self._lock:
            for conn in self._open:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)


def _pump(local: socket.socket, remote: WebSocketTransport) -> None:
    """Copy bytes both ways until either side closes: the websocket's reader in a thread
    of its own (`recv` drives the socket, and flushes what `send` queues)."""

    def down() -> None:
        try:
            while data := remote.recv():
                local.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                local.shutdown(socket.SHUT_RDWR)

    reader = threading.Thread(target=down, name="corral-forward-reader", daemon=True)
    reader.start()
    try:
        while data := local.recv(IO_CHUNK):
            remote.send(data)
    except OSError:
        pass
    finally:
        remote.shutdown()
        reader.join()
