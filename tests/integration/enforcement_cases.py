"""Enforcement scenarios, run against a real sandbox by the Docker and Kubernetes tests.

Each returns what the sandbox saw; the provider's test asserts its own guarantee (Docker
flushes established flows at a switch, a CNI may keep them: see each test)."""

from __future__ import annotations

import anyio

from corral import NetworkPolicy
from corral.core.session import EnvironmentSession


def _flow_script(host: str, port: int) -> str:
    """Every 0.1 s for 4 s: a datagram over the flow opened first, and over a new one,
    each printed as ok or blocked (old/new)."""
    return (
        "import socket,time\n"
        "def ask(s):\n"
        " try:\n  s.send(b'x');s.recv(64);return 'ok'\n"
        " except OSError:\n  return 'blocked'\n"
        "def sock():\n"
        " s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(0.5)\n"
        f" s.connect(('{host}',{port}));return s\n"
        "old=sock()\n"
        "for i in range(40):\n"
        " print(ask(old)+'/'+ask(sock()),flush=True);time.sleep(0.1)\n"
    )


async def flows_across_a_switch(
    session: EnvironmentSession, host: str, port: int
) -> list[tuple[str, str]]:
    """A UDP echo at `host:port` asked over the first flow and a new one, in turn, while
    the session (under `public`) switches to no-network 1.5 s in: (old, new) per ask."""
    lines: list[str] = []
    async with anyio.create_task_group() as tg:

        async def run() -> None:
            result = await session.exec(["python3", "-c", _flow_script(host, port)], timeout=120)
            lines.extend(result.stdout.split())

        tg.start_soon(run)
        await anyio.sleep(1.5)
        await session.set_network_policy(NetworkPolicy.no_network())
    pairs = [line.split("/") for line in lines]
    return [(old, new) for old, new in pairs]
