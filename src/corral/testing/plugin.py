"""Pytest plugin (entry point `pytest11: corral`): fixtures for the conformance suite.

A provider's test module supplies `corral_environment` and `corral_plan`, overrides
`corral_egress_targets` when loopback on the test host is not what its sandboxes reach,
and star-imports `corral.testing.conformance`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

import pytest

from corral.testing.servers import serve_tcp, stop_server


class EgressTarget(NamedTuple):
    """A TCP listener the sandbox can reach under `public`."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


ConnectCommand = Callable[[EgressTarget], list[str]]
ServeCommand = Callable[[int, str], list[str]]


@pytest.fixture
def corral_egress_targets() -> Iterator[list[EgressTarget]]:
    """Two listeners reachable from the sandbox under `public` (default: host loopback)."""
    servers = [serve_tcp() for _ in range(2)]
    try:
        yield [EgressTarget("127.0.0.1", s.getsockname()[1]) for s, _ in servers]
    finally:
        for server, thread in servers:
            stop_server(server, thread)


@pytest.fixture
def corral_connect_command() -> ConnectCommand:
    """The command that exits 0 iff a TCP connection to the target succeeds."""
    return lambda target: ["nc", "-z", "-w", "3", target.host, str(target.port)]


@pytest.fixture
def corral_serve_command() -> ServeCommand:
    """A command that serves `text` once on `port` inside the sandbox, then exits."""
    return lambda port, text: ["sh", "-c", f"printf '{text}' | nc -l -N -p {port}"]
