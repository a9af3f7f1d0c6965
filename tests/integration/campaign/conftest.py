"""The cancellation campaign's fixtures, and its summary table at the end of the run.

`CORRAL_CAMPAIGN_MAX_N=K` bounds each operation to its first K checkpoints (a quick look);
unset, every operation runs until it completes without meeting the cancellation.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path

import pytest

from corral.testing import serve_tcp, stop_server
from corral.testing.campaign import Report, markdown
from corral.testing.plugin import EgressTarget
from tests.integration.docker.conftest import engine as engine
from tests.integration.docker.conftest import owner as owner
from tests.integration.k8s.conftest import cluster as cluster
from tests.integration.k8s.conftest import namespace as namespace

REPORTS: list[Report] = []


def max_n() -> int | None:
    value = os.environ.get("CORRAL_CAMPAIGN_MAX_N", "")
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"CORRAL_CAMPAIGN_MAX_N={value!r} is not a positive integer")
    return int(value)


@contextmanager
def two_targets(
    first: str = "127.0.0.1", second: str = "127.0.0.1"
) -> Generator[tuple[EgressTarget, EgressTarget]]:
    """A TCP server on each address (the campaign's switch goes from one to the other),
    stopped afterwards."""
    servers = [serve_tcp(first), serve_tcp(second)]
    try:
        one, other = (EgressTarget(*s.getsockname()[:2]) for s, _ in servers)
        yield one, other
    finally:
        for server, thread in servers:
            stop_server(server, thread)


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty host directory; tempfile's directory is one of the test's own meanwhile,
    so that no other user of corral on this host can count as a leak."""
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    directory = tmp_path / "scratch"
    directory.mkdir()
    return directory


def check(report: Report) -> None:
    """Keep `report` for the summary, then fail on any problem it found."""
    REPORTS.append(report)
    assert not report.problems, "\n".join(
        f"N={p.n}: {p.cause}: {p.detail}" for p in report.problems
    )
    assert report.completed or max_n() is not None


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if REPORTS:
        terminalreporter.write_sep("-", "cancellation campaign")
        terminalreporter.write_line(markdown(REPORTS))
