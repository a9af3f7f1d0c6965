"""The docs site builds strictly (every link and anchor resolves, README and SECURITY.md
included, the API reference generated), and every Python block of README and docs is
run (the Quickstart: tests/integration/*/test_*_quickstart.py) or, where marked as a
fragment, at least compiles and imports what it names from corral."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(
    r"^(<!-- fragment: (?P<why>[^>]+) -->\n)?```python\n(?P<code>.*?)^```$", re.M | re.S
)


def blocks() -> list[tuple[str, str | None, str]]:
    found: list[tuple[str, str | None, str]] = []
    for page in PAGES:
        text = page.read_text()
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", match["why"], match["code"]))
    return found


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        reason = "the docs need the docs extra: uv sync --all-extras"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI must install it)")
        pytest.skip(reason)
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "6 * 7" in (tmp_path / "index.html").read_text()  # the Quickstart, included
    assert "cancelled_on_signals" in (tmp_path / "reference" / "index.html").read_text()


def test_every_python_block_is_run_or_marked_a_fragment() -> None:
    unmarked = [where for where, why, _ in blocks() if why is None]
    # The one block that runs as written, in the README and (included) on the site.
    assert unmarked == ["README.md:59"], unmarked


@pytest.mark.parametrize(("where", "code"), [(w, c) for w, _, c in blocks()])
def test_each_block_compiles_and_its_corral_imports_exist(where: str, code: str) -> None:
    tree = compile(code, where, "exec", flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    assert isinstance(tree, ast.Module)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("corral"):
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                assert hasattr(module, alias.name), f"{where}: {node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("corral"):
                    importlib.import_module(alias.name)
