from __future__ import annotations

import pytest

from corral.errors import ConfigError
from corral.workspace.patterns import matches


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("**/*", "a", True),
        ("**/*", "a/b/.hidden", True),
        ("**/*.py", "x.py", True),
        ("**/*.py", "a/b/x.py", True),
        ("**/*.py", "a/b/x.pyc", False),
        ("*.py", "a/x.py", False),
        ("src/**", "src/a/b", True),
        ("src/**", "other/a", False),
        ("src/*/x", "src/a/x", True),
        ("src/*/x", "src/a/b/x", False),
        ("f?.txt", "f1.txt", True),
        ("f?.txt", "f/.txt", False),
        ("[ab].md", "a.md", True),
        ("[!ab].md", "c.md", True),
        ("[!ab].md", "a.md", False),
        ("a+b.txt", "a+b.txt", True),
    ],
)
def test_globs(pattern: str, path: str, expected: bool) -> None:
    assert matches(pattern, path) is expected


@pytest.mark.parametrize("pattern", ["", "/abs", "a//b", "../x", "a/./b", "[ab"])
def test_bad_patterns_name_the_pattern(pattern: str) -> None:
    with pytest.raises(ConfigError, match="pattern"):
        matches(pattern, "x")
