"""The cancellation campaign finds what a provider leaks or swallows (on in-memory fakes;
the campaign's real runs are in tests/integration/campaign/)."""

from __future__ import annotations

import itertools
import tempfile
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from corral import ExecutionPlan, NetworkPolicy, NetworkSchedule
from corral.core.session import EnvironmentSession
from corral.testing.campaign import Subject, markdown, reaches, run_campaign
from corral.testing.plugin import EgressTarget
from tests.unit.fakes import FakeEnvironment, FakeSession

pytestmark = pytest.mark.anyio

FIRST, SECOND = EgressTarget("192.0.2.1", 80), EgressTarget("192.0.2.2", 80)


class LeakyOpen(FakeEnvironment):
    """Registers its undo only after a checkpoint that follows the create."""

    made = itertools.count()

    async def _open(
        self, plan: ExecutionPlan, owned: AsyncExitStack, *, session_id: str | None
    ) -> EnvironmentSession:
        name = f"resource-leaky-{next(self.made)}"
        self.live.add(name)
        await anyio.lowlevel.checkpoint()
        owned.callback(self.live.discard, name)
        return self.session_type(self, plan.network.baseline)


class CarelessSession(FakeSession):
    async def _upload_dir(self, local_dir: Path, remote_dir: str, service: str | None) -> None:
        try:
            await anyio.lowlevel.checkpoint()
        except anyio.get_cancelled_exc_class():
            pass  # the defect: the caller never learns it was cancelled

    async def _download_dir(self, remote_dir: str, local_dir: Path, service: str | None) -> None:
        staging = Path(local_dir).parent / ".corral-staging"
        staging.mkdir()
        await anyio.lowlevel.checkpoint()
        staging.rmdir()  # the defect: never reached when cancelled


class CarelessEnvironment(FakeEnvironment):
    session_type = CarelessSession


def _subject(env: FakeEnvironment, scratch: Path) -> Subject:
    return Subject(
        provider="fake",
        env=env,
        plan=ExecutionPlan(),
        owned=lambda: frozenset(env.live),
        targets=(FIRST, SECOND),
        switch=(NetworkPolicy.public(), NetworkPolicy.no_network()),
        connect=lambda target: ["true"],
        scratch=scratch,
    )


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    directory = tmp_path / "scratch"
    directory.mkdir()
    return directory


async def test_a_sound_open_passes(scratch: Path) -> None:
    report = await run_campaign(_subject(FakeEnvironment(), scratch), "open")
    assert report.completed
    assert report.problems == []
    assert report.faults == len(report.attempts) - 1 > 0


async def test_an_undo_registered_late_is_a_leak(scratch: Path) -> None:
    report = await run_campaign(_subject(LeakyOpen(), scratch), "open")
    # The limiter's checkpoint is shielded, so cancelling there lands on the late one too.
    assert [(p.n, p.cause) for p in report.leaks] == [
        (1, "provider objects"),
        (2, "provider objects"),
        (0, "provider objects"),
    ]
    assert "resource-leaky-" in report.leaks[0].detail


async def test_a_swallowed_cancellation_is_a_failure(scratch: Path) -> None:
    report = await run_campaign(_subject(CarelessEnvironment(), scratch), "upload_dir")
    assert [(p.n, p.cause) for p in report.failures] == [(1, "swallowed the cancellation")]


async def test_a_staging_directory_left_behind_is_a_leak(scratch: Path) -> None:
    report = await run_campaign(_subject(CarelessEnvironment(), scratch), "download_dir")
    assert [(p.n, p.cause) for p in report.leaks] == [(1, "temp files")]
    assert ".corral-staging" in report.leaks[0].detail


async def test_a_sandbox_that_reaches_what_its_policy_forbids_is_a_mix(scratch: Path) -> None:
    # The fake's every connection succeeds: the union of the two allowlists.
    old, new = NetworkPolicy.allowlist(str(FIRST)), NetworkPolicy.allowlist(str(SECOND))
    env = FakeEnvironment()
    subject = replace(
        _subject(env, scratch),
        plan=ExecutionPlan(network=NetworkSchedule(baseline=old)),
        switch=(old, new),
    )
    report = await run_campaign(subject, "set_network_policy")
    assert report.completed
    assert {p.cause for p in report.failures} == {"policy mix"}
    assert len(report.failures) == len(report.attempts)
    assert f"{SECOND}: open" in report.failures[0].detail


def test_reachability_follows_the_policy() -> None:
    only_first = NetworkPolicy.allowlist(str(FIRST))
    assert [reaches(only_first, t) for t in (FIRST, SECOND)] == [True, False]
    assert [reaches(NetworkPolicy.denylist(str(FIRST)), t) for t in (FIRST, SECOND)] == [
        False,
        True,
    ]
    assert not reaches(NetworkPolicy.no_network(), FIRST)
    assert reaches(NetworkPolicy.public(), SECOND)


async def test_the_summary_counts_failures_by_cause_and_leaks(scratch: Path) -> None:
    reports = [
        await run_campaign(_subject(LeakyOpen(), scratch), "open"),
        await run_campaign(_subject(CarelessEnvironment(), scratch), "upload_dir"),
    ]
    table = markdown(reports).splitlines()
    assert table[2].startswith("| fake | open | ")
    assert table[2].endswith("| 0 | 3 |")
    assert table[-1].endswith("| 1 swallowed the cancellation | 3 |")
