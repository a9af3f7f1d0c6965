"""The cancellation campaign against the embedded `local` provider."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from corral import ENVIRONMENTS, ExecutionPlan, NetworkPolicy
from corral.core.snapshot_store import cache_dir
from corral.errors import FeatureUnsupported
from corral.providers.local import cgroup as local_cgroup
from corral.testing.campaign import OPERATIONS, Subject, run_campaign
from corral.testing.plugin import ConnectCommand
from tests.integration.campaign.conftest import check, max_n, two_targets

pytestmark = pytest.mark.anyio


def _owned() -> frozenset[str]:
    """What local makes besides its workspaces (temp files): session cgroups, and the
    records `corral gc` reads."""
    cgroups = {f"cgroup {p.name}" for p in _cgroups().glob("corral-*")}
    records = {f"record {p.name}" for p in (cache_dir() / "sessions" / "local").glob("*.json")}
    return frozenset(cgroups | records)


def _cgroups() -> Path:
    try:
        return local_cgroup._hierarchy()  # pyright: ignore[reportPrivateUsage]
    except FeatureUnsupported:
        return Path("/nonexistent")


@pytest.fixture
def subject(scratch: Path, corral_connect_command: ConnectCommand) -> Iterator[Subject]:
    with two_targets() as targets:
        yield Subject(
            provider="local",
            env=ENVIRONMENTS.create("local"),
            plan=ExecutionPlan(),
            owned=_owned,
            targets=targets,
            switch=(NetworkPolicy.no_network(), NetworkPolicy.public()),
            connect=corral_connect_command,
            scratch=scratch,
            max_n=max_n(),
        )


@pytest.mark.parametrize("operation", OPERATIONS)
async def test_cancelled_at_every_checkpoint_leaves_nothing(
    subject: Subject, operation: str
) -> None:
    check(await run_campaign(subject, operation))
