"""A fault-injecting proxy in front of a Kubernetes API server.

It terminates TLS on 127.0.0.1 with a throwaway CA of its own (made with the `openssl`
command), and forwards each request to the real API server over TLS with the client
credentials of the kubeconfig it was given; what it fails and how is
`corral.testing.fault_proxy`'s. Exec and port-forward websockets pass through as raw
pipes once upgraded. `kubeconfig` is a kubeconfig pointing at the proxy, to hand the
code under test; calls are recorded as route patterns
(`POST /api/v1/namespaces/{ns}/pods`).

Only client-certificate and token kubeconfigs are supported (a token is handed on to the
code under test, which sends it through the proxy unchanged).
"""

from __future__ import annotations

import importlib
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from corral.testing.fault_proxy import Action, Call, FaultProxy

__all__ = ["Action", "ApiServerFaultProxy", "Call", "TlsConn", "route_pattern"]

_NAMESPACE_SUBRESOURCES = {"status", "finalize"}


def route_pattern(path: str) -> str:
    """A request path with its query, namespace and object names taken out:
    `/api/v1/namespaces/ns-1/pods/p-1/exec?command=ls` is
    `/api/v1/namespaces/{ns}/pods/{name}/exec`. Paths outside `/api` and `/apis`
    (`/version`, `/healthz`) stay as they are."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if parts[:1] == ["api"] and len(parts) >= 2:
        head, rest = parts[:2], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        head, rest = parts[:3], parts[3:]
    else:
        return "/" + "/".join(parts)
    if rest[:1] == ["watch"]:
        head, rest = [*head, "watch"], rest[1:]
    namespaced = rest[:1] == ["namespaces"] and len(rest) >= 3
    if namespaced and not (len(rest) == 3 and rest[2] in _NAMESPACE_SUBRESOURCES):
        head, rest = [*head, "namespaces", "{ns}"], rest[2:]
    if rest:
        head.append(rest[0])  # the resource
    if len(rest) >= 2:
        head.append("{name}")
    return "/" + "/".join(head + rest[2:])  # then the subresource, if any


class TlsConn:
    """TLS over a blocking socket whose reads and writes come from two threads.

    An `ssl.SSLSocket` may not be read in one thread while written in another (OpenSSL's
    rule for one SSL object), and a proxy's pipes do exactly that. Here the TLS state
    sits in memory BIOs touched only under a lock, while the socket's own I/O happens
    outside it; records go out in the order they were made.
    """

    def __init__(
        self,
        sock: socket.socket,
        context: ssl.SSLContext,
        *,
        server_side: bool,
        server_hostname: str | None = None,
    ) -> None:
        self.sock = sock
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._tls = context.wrap_bio(
            self._incoming, self._outgoing, server_side=server_side, server_hostname=server_hostname
        )
        self._lock = threading.Lock()  # the TLS object and its BIOs
        self._sending = threading.Lock()  # one writer on the socket, records in order
        while True:
            try:
                with self._lock:
                    self._tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                self._flush()
                if not self._feed():
                    raise ConnectionError("the peer closed during the TLS handshake") from None
        self._flush()

    def _flush(self, *, wait: bool = True) -> None:
        """Send what the TLS object has made; without `wait`, only if no one else is."""
        if not self._sending.acquire(blocking=wait):
            return
        try:
            with self._lock:
                data = self._outgoing.read()
            if data:
                self.sock.sendall(data)
        finally:
            self._sending.release()

    def _feed(self) -> bool:
        data = self.sock.recv(65536)
        with self._lock:
            if data:
                self._incoming.write(data)
            else:
                self._incoming.write_eof()
        return bool(data)

    def recv(self, bufsize: int, /) -> bytes:
        while True:
            with self._lock:
                try:
                    data = self._tls.read(bufsize)
                except ssl.SSLWantReadError:
                    data = None
                except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                    return b""
                pending = self._outgoing.pending
            if pending:  # a post-handshake message; a writer flushes it if busy
                self._flush(wait=False)
            if data is not None:
                return data
            self._feed()  # at its end, the next read sees EOF

    def sendall(self, data: bytes, /) -> None:
        with self._sending:
            with self._lock:
                self._tls.write(data)
                records = self._outgoing.read()
            self.sock.sendall(records)

    def shutdown(self, how: int, /) -> None:
        self.sock.shutdown(how)


@dataclass
class ApiServerFaultProxy(FaultProxy):
    """Forwards to the API server of `upstream_kubeconfig` (its current context, or
    `context`) with that kubeconfig's credentials."""

    upstream_kubeconfig: str | None = None
    context: str | None = None
    _dir: Path | None = None
    _port: int = 0
    _server: ssl.SSLContext | None = None
    _client: ssl.SSLContext | None = None
    _upstream: tuple[str, int, str] = ("", 0, "")  # host, port, TLS server name

    @property
    def kubeconfig(self) -> str:
        """A kubeconfig for the code under test, pointing at the proxy."""
        assert self._dir is not None, "start() first"
        return str(self._dir / "kubeconfig")

    def start(self) -> ApiServerFaultProxy:
        self._dir = Path(tempfile.mkdtemp(prefix="corral-api-faults-"))
        token = self._load_upstream()
        ca = _throwaway_ca(self._dir)
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.load_cert_chain(self._dir / "server.crt", self._dir / "server.key")
        server.set_alpn_protocols(["http/1.1"])
        server.num_tickets = 0
        self._server = server
        super().start()
        user: dict[str, str] = {"token": token} if token else {}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "fault-proxy",
                    "cluster": {
                        "server": f"https://127.0.0.1:{self._port}",
                        "certificate-authority": str(ca),
                    },
                }
            ],
            "users": [{"name": "fault-proxy", "user": user}],
            "contexts": [
                {
                    "name": "fault-proxy",
                    "context": {"cluster": "fault-proxy", "user": "fault-proxy"},
                }
            ],
            "current-context": "fault-proxy",
        }
        Path(self.kubeconfig).write_text(yaml.safe_dump(config))
        return self

    def __enter__(self) -> ApiServerFaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _load_upstream(self) -> str | None:
        """Where the API server is and how to reach it; the bearer token, if any."""
        k8s_config: Any = importlib.import_module("kubernetes.config")
        k8s_client: Any = importlib.import_module("kubernetes.client")
        configuration: Any = k8s_client.Configuration()
        k8s_config.load_kube_config(
            config_file=self.upstream_kubeconfig,
            context=self.context,
            client_configuration=configuration,
        )
        url = urlsplit(str(configuration.host))
        host = url.hostname or "127.0.0.1"
        self._upstream = (host, url.port or 443, configuration.tls_server_name or host)
        client = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
        if not configuration.verify_ssl:
            client.check_hostname = False
            client.verify_mode = ssl.CERT_NONE
        if configuration.cert_file:
            client.load_cert_chain(configuration.cert_file, configuration.key_file)
        client.set_alpn_protocols(["http/1.1"])
        self._client = client
        keys: dict[str, str] = configuration.api_key or {}
        bearer = keys.get("authorization", "")
        return bearer.removeprefix("Bearer ").strip() or None

    def _bind(self) -> socket.socket:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self._port))
        listener.listen(64)
        self._port = listener.getsockname()[1]
        return listener

    def _accepted(self, sock: socket.socket) -> TlsConn:
        assert self._server is not None
        return TlsConn(sock, self._server, server_side=True)

    def _connect(self) -> tuple[socket.socket, TlsConn]:
        assert self._client is not None
        host, port, name = self._upstream
        sock = socket.create_connection((host, port), timeout=10)
        sock.settimeout(None)
        return sock, TlsConn(sock, self._client, server_side=False, server_hostname=name)

    def _route(self, path: str) -> str:
        return route_pattern(path)

    def _remove_files(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


def _throwaway_ca(directory: Path) -> Path:
    """A CA and a server certificate for 127.0.0.1 signed by it; the CA's path."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=corral fault proxy CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (directory / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n"
    )
    sign = ("-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2")
    openssl(
        "x509", "-req", "-in", "server.csr", *sign, "-out", "server.crt", "-extfile", "server.ext"
    )
    return directory / "ca.crt"
