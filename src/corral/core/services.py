"""Services beside the sandbox: what every provider does the same way once they run."""

from __future__ import annotations

from collections.abc import Mapping

import anyio

from corral.core.plan import ServiceSpec
from corral.core.redact import redact, secret_values
from corral.core.session import EnvironmentSession
from corral.errors import ProviderError

#: characters of a failed check's output an error quotes
QUOTED_OUTPUT = 300


async def wait_healthy(session: EnvironmentSession, services: Mapping[str, ServiceSpec]) -> None:
    """Return once every service with a healthcheck passed it, checked concurrently;
    `ProviderError` naming the service, its last exit and output once one runs out of
    retries. The caller bounds the whole wait (`timeouts.startup_s`)."""
    failures: list[ProviderError] = []

    async def wait(name: str, spec: ServiceSpec) -> None:
        try:
            await _wait_one(session, name, spec)
        except ProviderError as exc:
            # The first failure ends the wait: one error, not a group, reaches the caller.
            failures.append(exc)
            group.cancel_scope.cancel()

    async with anyio.create_task_group() as group:
        for name, spec in services.items():
            if spec.healthcheck is not None:
                group.start_soon(wait, name, spec)
    if failures:
        raise failures[0]


async def _wait_one(session: EnvironmentSession, name: str, spec: ServiceSpec) -> None:
    check = spec.healthcheck
    assert check is not None
    await anyio.sleep(check.start_period_s)
    last = ""
    for attempt in range(check.retries):
        if attempt:
            await anyio.sleep(check.interval_s)
        result = await session.exec(check.argv(), service=name, timeout=check.timeout_s)
        if result.ok:
            return
        outcome = "timed out" if result.timed_out else f"exited {result.returncode}"
        output = (result.stderr or result.stdout).strip()[-QUOTED_OUTPUT:]
        last = f"{outcome}: {output}" if output else outcome
    # A service's output may echo its own env: its secret values are masked.
    raise ProviderError(
        f"service {name!r} did not become healthy after {check.retries} healthcheck "
        f"attempts; the last {redact(last, secret_values(spec.env))}"
    )
