"""The Python blocks of README and docs, as programs to run: the Quickstart on `local` as
written and on another provider with the one word it says to change; every other block
that is not marked a fragment, with what its text says it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(
    r"^(<!-- fragment: (?P<why>[^>]+) -->\n)?```python\n(?P<code>.*?)^```\n"
    r"(\nIt prints `(?P<prints>[^`]*)`)?",
    re.M | re.S,
)
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
    """One Python block: where it is, why it cannot run alone (a fragment), what it prints."""

    def __init__(self, where: str, code: str, fragment: str | None, prints: str | None) -> None:
        self.where, self.code, self.fragment, self.prints = where, code, fragment, prints


def python_blocks() -> list[Block]:
    found: list[Block] = []
    for page in PAGES:
        text = page.read_text()
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            where = f"{page.relative_to(ROOT)}:{line}"
            found.append(Block(where, match["code"], match["why"], match["prints"]))
    return found
