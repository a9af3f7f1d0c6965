"""Engine faults: a proxy in front of the Docker socket fails one API call of an `open`.

For every call an open makes, in turn: answered with a 500, or its connection dropped;
for a few chosen calls, stalled. Each open must succeed (a retried idempotent call) or
raise `ProviderError` naming the call, within its bounds, leaving nothing behind; calls
that create something are never sent twice.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from corral import ExecutionPlan, NetworkPolicy, NetworkSchedule
from corral.core.plan import Timeouts
from corral.errors import ProviderError
from corral.testing.engine_faults import Action, Call, EngineFaultProxy
from tests.integration.docker.conftest import TEST_IMAGE, leftovers, make_env

pytestmark = pytest.mark.anyio

PLAN = ExecutionPlan(
    image=TEST_IMAGE,
    network=NetworkSchedule(baseline=NetworkPolicy.no_network()),
    timeouts=Timeouts(startup_s=60),
)
API_TIMEOUT_S = 3.0
#: Creating calls: a retry after a lost answer could make a second one.
CREATES = {
    Call("POST", "/containers/create"),
    Call("POST", "/networks/create"),
    Call("POST", "/volumes/create"),
}


async def _open_through(owner: str, proxy: EngineFaultProxy) -> tuple[str, float]:
    env = make_env(owner, base_url=proxy.base_url, api_timeout_s=API_TIMEOUT_S)
    started = time.monotonic()
    try:
        session = await env.open(PLAN)
    except ProviderError as exc:
        return f"ProviderError: {exc}", time.monotonic() - started
    elapsed = time.monotonic() - started
    await env.close(session)
    return "opened", elapsed


async def _calls_of_an_open(owner: str) -> list[Call]:
    with EngineFaultProxy() as proxy:
        env = make_env(owner, base_url=proxy.base_url, api_timeout_s=API_TIMEOUT_S)
        session = await env.open(PLAN)
        calls = list(proxy.calls)
        await env.close(session)
    return calls


async def _fault_each(engine: Any, owner: str, action: Action, at: list[int]) -> list[str]:
    """One open per entry of `at`, its call number `n` failed with `action`; the rows."""
    rows: list[str] = []
    for n in at:
        with EngineFaultProxy(fault_at=n, action=action) as proxy:
            outcome, elapsed = await _open_through(owner, proxy)
            calls = list(proxy.calls)
        hit = calls[n - 1] if len(calls) >= n else None
        rows.append(f"{n:3} {action:5} {hit} -> {outcome[:140]} ({elapsed:.2f} s)")
        assert hit is not None, f"the open made fewer than {n} calls: {calls}"
        assert leftovers(engine, owner) == [], rows[-1]
        if outcome != "opened":
            # Named: the docker-py method, or the engine's answer with the call's URL.
            assert "failed" in outcome and ("Docker Engine call" in outcome or "http" in outcome)
        if hit in CREATES:
            assert calls[n : n + 1] != [hit], f"{hit} was sent again after a {action}"
        # Each stall ends at the per-call timeout, possibly after a few idempotent retries.
        assert elapsed < 5 * API_TIMEOUT_S + 10, rows[-1]
    return rows


@pytest.mark.parametrize("action", ["error", "drop"])
async def test_a_fault_at_any_call_of_open_is_clean(
    engine: Any, owner: str, action: Action
) -> None:
    calls = await _calls_of_an_open(owner)
    assert len(calls) >= 10, calls
    # Call 1 is the client's version check, made before anything exists.
    rows = await _fault_each(engine, owner, action, list(range(2, len(calls) + 1)))
    print("\n".join(rows))
    assert any("ProviderError" in row for row in rows)


async def test_a_stalled_call_ends_at_its_timeout(engine: Any, owner: str) -> None:
    calls = await _calls_of_an_open(owner)
    chosen = [Call("POST", "/networks/create"), Call("POST", "/containers/create")]
    at = [calls.index(c) + 1 for c in chosen]
    at.append(next(i for i, c in enumerate(calls, 1) if c.route.endswith("/start")))
    rows = await _fault_each(engine, owner, "stall", at)
    print("\n".join(rows))
    assert all("ProviderError" in row for row in rows), rows
