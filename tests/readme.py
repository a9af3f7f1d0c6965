"""The code blocks of README and docs, as programs to run. Python: the Quickstart on
`local` as written and on another provider with the one word it says to change; every
other block that is not marked a fragment, with what its text says it prints: on `local`,
or on the provider a `<!-- runs on: NAME -->` line before it names. Shell: each block says
before it how it is checked (`<!-- shell: runs -->`: line by line, as written)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from corral.core.labels import OWNER

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(
    r"^(<!-- (?:fragment: (?P<why>[^>]+)|runs on: (?P<on>[a-z0-9]+)) -->\n)?"
    r"```python\n(?P<code>.*?)^```\n"
    r"(\nIt prints `(?P<prints>[^`]*)`)?",
    re.M | re.S,
)
_SHELL = re.compile(r"^(<!-- shell: (?P<how>[^>]+) -->\n)?```sh\n(?P<code>.*?)^```\n", re.M | re.S)
AS_WRITTEN = 'ENVIRONMENTS.create("local")'
#: what the Quickstart prints on every provider
PRINTED = "42 ['public', 'no-network', 'no-network', 'public']\n"


def quickstart(provider: str = "local") -> str:
    text = README.read_text()
    start = text.index("```python\n", text.index("## Quickstart")) + len("```python\n")
    block = text[start : text.index("```\n", start)]
    assert AS_WRITTEN in block, "the Quickstart no longer opens `local` as written"
    return block.replace(AS_WRITTEN, f'ENVIRONMENTS.create("{provider}")')


def run_quickstart(provider: str = "local") -> subprocess.CompletedProcess[str]:
    program = [sys.executable, "-c", quickstart(provider)]
    return subprocess.run(program, capture_output=True, text=True, timeout=300, check=False)


class Block:
    """One Python block: where it is, why it cannot run alone (a fragment), what it prints,
    the provider it runs on."""

    def __init__(
        self, where: str, code: str, fragment: str | None, prints: str | None, on: str
    ) -> None:
        self.where, self.code, self.fragment, self.prints = where, code, fragment, prints
        self.on = on


def python_blocks() -> list[Block]:
    found: list[Block] = []
    for page in PAGES:
        text = page.read_text()
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            where = f"{page.relative_to(ROOT)}:{line}"
            on = match["on"] or "local"
            found.append(Block(where, match["code"], match["why"], match["prints"], on))
    return found


def shell_blocks() -> list[tuple[str, str | None, str]]:
    """Every shell block: where it is, how it says it is checked, its text."""
    found: list[tuple[str, str | None, str]] = []
    for page in PAGES:
        text = page.read_text()
        for match in _SHELL.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", match["how"], match["code"]))
    return found


def runnable(on: str) -> list[Block]:
    """The blocks that run as whole programs on provider `on`."""
    return [b for b in python_blocks() if b.fragment is None and b.on == on]


def run_block(block: Block, cache: Path) -> None:
    """Run `block` as a program in `cache` (what it keeps, a snapshot, session records or
    Inspect's logs, goes there); it must end well and print what its text says."""
    done = subprocess.run(
        [sys.executable, "-c", block.code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cache,
        env={**os.environ, "XDG_CACHE_HOME": str(cache)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{block.prints}\n", (done.stdout, done.stderr[-2000:])


def docker_leftovers(engine: Any, *owners: str) -> list[str]:
    """What carries any of `owners`' labels on the engine: containers, networks, volumes,
    images (a block run with a default owner must leave none of them)."""
    found: list[str] = []
    for owner in owners:
        selector = {"label": f"{OWNER}={owner}"}
        found += [f"container {c['Id']}" for c in engine.api.containers(all=True, filters=selector)]
        found += [f"network {n['Id']}" for n in engine.api.networks(filters=selector)]
        volumes: list[dict[str, Any]] = engine.api.volumes(filters=selector)["Volumes"] or []
        found += [f"volume {v['Name']}" for v in volumes]
        found += [f"image {i['Id']}" for i in engine.api.images(filters=selector)]
    return found
