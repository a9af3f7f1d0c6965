"""A fault-injecting proxy in front of the Docker Engine's API socket.

The proxy listens on a Unix socket of its own and forwards to the engine's; what it
fails and how is `corral.testing.fault_proxy`'s. Routes are paths without the API
version and query (`POST /containers/create`).
"""

from __future__ import annotations

import re
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

from corral.testing.fault_proxy import Action, Call, FaultProxy

__all__ = ["Action", "Call", "EngineFaultProxy"]

_VERSION = re.compile(r"^/v[0-9.]+")


@dataclass
class EngineFaultProxy(FaultProxy):
    """Forwards to the engine socket `upstream`."""

    upstream: str = "/var/run/docker.sock"
    _dir: Path | None = None

    @property
    def base_url(self) -> str:
        return f"unix://{self._socket_path}"

    @property
    def _socket_path(self) -> Path:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="corral-faults-"))
        return self._dir / "engine.sock"

    def start(self) -> EngineFaultProxy:
        super().start()
        return self

    def __enter__(self) -> EngineFaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _bind(self) -> socket.socket:
        self._socket_path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self._socket_path))
        listener.listen(64)
        return listener

    def _connect(self) -> tuple[socket.socket, socket.socket]:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.connect(self.upstream)
        return upstream, upstream

    def _route(self, path: str) -> str:
        return _VERSION.sub("", path.split("?", 1)[0])

    def _remove_files(self) -> None:
        if self._dir is not None:
            self._socket_path.unlink(missing_ok=True)
            self._dir.rmdir()
