"""The cancellation campaign against a real Docker Engine.

The sandbox's two egress targets are host listeners on this run's own veth addresses; the
switch goes from an allowlist of the first to an allowlist of the second.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral import ExecutionPlan, NetworkPolicy, NetworkSchedule
from corral.core.labels import OWNER
from corral.testing.campaign import OPERATIONS, Report, Subject, run_campaign
from corral.testing.checkpoints import Outcome
from corral.testing.plugin import ConnectCommand
from tests.integration.campaign.conftest import check, max_n, two_targets
from tests.integration.docker.conftest import ALLOWED_IP, DENIED_IP, TEST_IMAGE, make_env

pytestmark = [pytest.mark.anyio, pytest.mark.docker]


def _labelled(engine: Any, owner: str) -> frozenset[str]:
    # The listing calls only: inspecting a container waits for its archive lock, which a
    # transfer in flight holds, and this runs on the event loop when a cancellation is
    # requested.
    selector = {"label": f"{OWNER}={owner}"}
    containers = engine.api.containers(all=True, filters=selector)
    networks = engine.api.networks(filters=selector)
    return frozenset(
        [c["Names"][0].lstrip("/") for c in containers] + [n["Name"] for n in networks]
    )


@pytest.fixture
def subject(
    engine: Any,
    owner: str,
    target_link: None,
    scratch: Path,
    corral_connect_command: ConnectCommand,
) -> Iterator[Subject]:
    mine = f"{owner}-{secrets.token_hex(3)}"
    try:
        with two_targets(ALLOWED_IP, DENIED_IP) as (first, second):
            switch = (NetworkPolicy.allowlist(str(first)), NetworkPolicy.allowlist(str(second)))
            yield Subject(
                provider="docker",
                env=make_env(mine),
                plan=ExecutionPlan(image=TEST_IMAGE, network=NetworkSchedule(baseline=switch[0])),
                owned=lambda: _labelled(engine, mine),
                targets=(first, second),
                switch=switch,
                connect=corral_connect_command,
                scratch=scratch,
                max_n=max_n(),
            )
    finally:
        _remove_labelled(engine, mine)


def _remove_labelled(engine: Any, owner: str) -> None:
    """What a failed campaign left (it names them first): only this test's owner label."""
    selector = {"label": f"{OWNER}={owner}"}
    for container in engine.containers.list(all=True, filters=selector):
        container.remove(force=True)
    for network in engine.networks.list(filters=selector):
        network.remove()


def _stage(present: frozenset[str]) -> str:
    """How far a docker open had got: which of the session's objects existed."""
    roles = {"network" if name.count("-") == 1 else name.rsplit("-", 1)[-1] for name in present}
    return "+".join(role for role in ("network", "holder", "sandbox") if role in roles)


@pytest.mark.parametrize("operation", OPERATIONS)
async def test_cancelled_at_every_checkpoint_leaves_nothing(
    subject: Subject, operation: str
) -> None:
    report = await run_campaign(subject, operation)
    check(report)
    if operation == "open" and max_n() is None:
        _assert_startup_covered(report)


def _assert_startup_covered(report: Report) -> None:
    """Cancellations landed at every stage of a cold start, the policy apply included."""
    cancelled = [a for a in report.attempts if a.outcome is Outcome.CANCELLED]
    stages = {_stage(a.present) for a in cancelled}
    assert {"", "network", "network+holder", "network+holder+sandbox"} <= stages, stages
    assert any("apply_policy" in a.landed for a in cancelled)
