"""The docs site builds strictly (every link and anchor resolves, README and SECURITY.md
included, the API reference generated), and every Python block of README and docs is
run (the Quickstart: tests/integration/*/test_*_quickstart.py) or, where marked as a
fragment, at least compiles and imports what it names from corral; every shell block says
how it is checked."""

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

from tests.readme import python_blocks, shell_blocks

ROOT = Path(__file__).parent.parent.parent


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


def test_every_python_block_says_what_it_prints_or_is_marked_a_fragment() -> None:
    # tests/integration/{local,docker}/test_*_docs.py run each that is not a fragment, and
    # test_agentcompass_docker.py those for AgentCompass (in the Python 3.12 stage).
    unsaid = [b.where for b in python_blocks() if b.fragment is None and b.prints is None]
    assert unsaid == [], unsaid
    elsewhere = [
        (b.where, b.on) for b in python_blocks() if b.on not in ("local", "docker", "agentcompass")
    ]
    assert elsewhere == [], "no suite runs blocks on these providers"
    assert sum(b.fragment is None for b in python_blocks()) >= 2


@pytest.mark.parametrize(("where", "code"), [(b.where, b.code) for b in python_blocks()])
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


def test_every_shell_block_says_how_it_is_checked() -> None:
    # "runs": tests/integration/docker/test_docker_docs.py runs it line by line; any other
    # word names the test or script that runs it, and that file exists.
    for where, how, _ in shell_blocks():
        assert how is not None, f"{where}: no <!-- shell: ... --> line before it"
        if not how.startswith("runs"):
            named = re.findall(r"(?:tests|bench|\.ci)/[\w./-]+", how)
            assert named and all((ROOT / n.rstrip(".")).exists() for n in named), (where, how)
    assert sum((how or "").startswith("runs") for _, how, _ in shell_blocks()) >= 2
