"""Fixtures shared by the unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

import corral.helper


@pytest.fixture
def helper_shipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An installation that carries corral's helper (what Docker declares depends on it),
    whether or not this checkout has built it."""
    (tmp_path / "corral-exec-linux-amd64").write_bytes(b"\x7fELF")
    monkeypatch.setattr(corral.helper, "BIN_DIR", tmp_path)
