"""`corral demo`: open a sandbox, use it, and show each declared network mode enforced."""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NamedTuple

from corral.core.environment import BaseEnvironment
from corral.core.plan import ExecutionPlan
from corral.core.session import EnvironmentSession
from corral.network.policy import NetworkMode, NetworkPolicy, NetworkSchedule
from corral.testing.servers import serve_tcp, stop_server


class DemoRow(NamedTuple):
    step: str
    outcome: str
    seconds: float
    passed: bool


async def run_demo(
    env: BaseEnvironment, plan: ExecutionPlan, report: Callable[[DemoRow], None]
) -> list[DemoRow]:
    """Run every step, report each row as it completes, and return them all."""
    rows: list[DemoRow] = []

    async def step(name: str, body: Callable[[], Awaitable[tuple[str, bool]]]) -> None:
        started = time.monotonic()
        try:
            outcome, passed = await body()
        except Exception as exc:
            outcome, passed = f"error: {exc}", False
        row = DemoRow(name, outcome, time.monotonic() - started, passed)
        rows.append(row)
        report(row)

    holder: list[EnvironmentSession] = []

    async def open_sandbox() -> tuple[str, bool]:
        sandbox = await env.open(plan)
        holder.append(sandbox)
        return f"sandbox {sandbox.id} ({env.id}, image {sandbox.image})", True

    await step("open", open_sandbox)
    if not holder:
        return rows
    opened = holder[0]
    try:

        async def run_commands() -> tuple[str, bool]:
            listing = await opened.exec(["uname", "-sr"])
            shell = await opened.exec("echo $((6 * 7)); exit 3")
            ok = listing.returncode == 0 and shell.stdout.strip() == "42"
            return f"uname: {listing.stdout.strip()}; sh exit code {shell.returncode}", ok

        async def round_trip() -> tuple[str, bool]:
            with tempfile.TemporaryDirectory(prefix="corral-demo-") as tmp:
                source = Path(tmp) / "in"
                (source / "nested").mkdir(parents=True)
                for i in range(20):
                    (source / "nested" / f"f{i}.txt").write_text(f"file {i}\n")
                root = (await opened.exec(["pwd"])).stdout.strip()
                await opened.upload_dir(source, f"{root}/demo")
                await opened.download_dir(f"{root}/demo", Path(tmp) / "out")
                same = all(
                    (Path(tmp) / "out" / "nested" / f"f{i}.txt").read_text() == f"file {i}\n"
                    for i in range(20)
                )
            return f"20 files up and back, exact root: {same}", same

        await step("exec", run_commands)
        await step("directory round trip", round_trip)
        servers = [serve_tcp("0.0.0.0") for _ in range(2)]
        ports = (servers[0][0].getsockname()[1], servers[1][0].getsockname()[1])
        try:
            for mode in sorted(env.network_capabilities().modes, key=list(NetworkMode).index):
                await step(
                    f"network {mode.value}",
                    lambda mode=mode: _probe_mode(env, plan, opened, mode, ports),
                )
        finally:
            for server, thread in servers:
                stop_server(server, thread)
    finally:
        await env.close(opened)
    return rows


async def _probe_mode(
    env: BaseEnvironment,
    plan: ExecutionPlan,
    opened: EnvironmentSession,
    mode: NetworkMode,
    ports: tuple[int, int],
) -> tuple[str, bool]:
    """Dial two host listeners under `mode`: switched live where the provider can."""
    gateway = await opened.host_gateway()
    if gateway is None:
        return "no route to a host listener to probe with", False
    targets = [f"{gateway}:{p}" for p in ports]
    policy = {
        NetworkMode.PUBLIC: NetworkPolicy.public(),
        NetworkMode.NO_NETWORK: NetworkPolicy.no_network(),
        NetworkMode.ALLOWLIST: NetworkPolicy.allowlist(targets[0]),
        NetworkMode.DENYLIST: NetworkPolicy.denylist(targets[1]),
    }[mode]
    if env.network_capabilities().dynamic:
        await opened.set_network_policy(policy)
        seen = [await _connects(opened, env, gateway, p) for p in ports]
    else:
        run_plan = plan.model_copy(update={"network": NetworkSchedule(baseline=policy)})
        async with env.session(run_plan) as sandbox:
            seen = [await _connects(sandbox, env, gateway, p) for p in ports]
    if None in seen:
        return f"{policy}: could not probe (no python3 or nc to dial with)", False
    expected = {
        NetworkMode.PUBLIC: [True, True],
        NetworkMode.NO_NETWORK: [False, False],
        NetworkMode.ALLOWLIST: [True, False],
        NetworkMode.DENYLIST: [True, False],
    }[mode]
    shown = ", ".join(
        f"{t} {'connected' if ok else 'refused'}" for t, ok in zip(targets, seen, strict=True)
    )
    return f"{policy}: {shown}", seen == expected


_DIAL = (
    "import socket,sys\n"
    "try:\n socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()\n"
    "except OSError:\n sys.exit(1)\n"
)
# Exit 127 when nothing can dial: a probe that could not run is never read as "refused".
_DIAL_ANY = (
    'if command -v python3 >/dev/null; then exec python3 -c "$0" "$1" "$2"; fi; '
    'if command -v nc >/dev/null; then nc -z -w 3 "$1" "$2" && exit 0; exit 1; fi; exit 127'
)


async def _connects(
    sandbox: EnvironmentSession, env: BaseEnvironment, host: str, port: int
) -> bool | None:
    """True if a TCP connection got through, False if refused, None if none could be tried.

    On `local` the sandbox is this host: dial with this very interpreter, so the demo does
    not depend on tools the host may lack.
    """
    if env.id == "local":
        argv = [sys.executable, "-c", _DIAL, host, str(port)]
    else:
        argv = ["sh", "-c", _DIAL_ANY, _DIAL, host, str(port)]
    result = await sandbox.exec(argv, timeout=20)
    if result.returncode in (0, 1):
        return result.returncode == 0
    return None
