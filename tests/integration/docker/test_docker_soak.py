"""The soak in CI size: 200 opens, 8 at a time, about a third cancelled at a random
moment and a third with a random Engine API call failed; `python -m bench.soak` runs the
full 1,000."""

from __future__ import annotations

import os
from typing import Any

import pytest

from corral import ExecutionPlan, NetworkPolicy, NetworkSchedule
from corral.testing.soak import soak
from tests.integration.docker.conftest import TEST_IMAGE, leftovers, make_env

pytestmark = pytest.mark.anyio

PLAN = ExecutionPlan(image=TEST_IMAGE, network=NetworkSchedule(baseline=NetworkPolicy.no_network()))


async def test_soak_leaves_nothing(engine: Any, owner: str) -> None:
    opens = int(os.environ.get("CORRAL_SOAK_OPENS", "200"))

    def env(base_url: str | None) -> Any:
        return make_env(owner, base_url=base_url, api_timeout_s=10)

    report = await soak(env, PLAN, lambda: leftovers(engine, owner), opens=opens, seed=11)
    print("\n" + report.table())
    assert report.failures == {}, report.table()
    assert report.leaks == [], report.leaks
    assert report.outcomes["completed"] > 0 and report.outcomes["cancelled"] > 0
    assert report.outcomes["ProviderError"] > 0, "no injected fault made an open fail"
    assert sum(report.outcomes.values()) == opens
