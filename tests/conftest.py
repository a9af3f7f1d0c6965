"""Every test run starts with corral's helper for this machine: a fresh clone has none
(it is built, not committed), so it is built here from helper/ when a Go is on PATH.
Without Go, what needs it skips, saying the command that builds it (in CI, where
tests/run.sh builds it first, it fails instead)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from collections.abc import Generator
from pathlib import Path

import pytest

from corral.errors import FeatureUnsupported
from corral.helper import helper_binary

ROOT = Path(__file__).resolve().parents[1]


def pytest_sessionstart(session: pytest.Session) -> None:
    if helper_binary(platform.machine()) is None and shutil.which("go"):
        subprocess.run(["bash", str(ROOT / "helper" / "build.sh")], check=True, timeout=1800)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    try:
        return (yield)
    except FeatureUnsupported as exc:
        if helper_binary(platform.machine()) is None and os.environ.get("CI") != "true":
            pytest.skip(f"{exc} (needs Go)")
        raise
