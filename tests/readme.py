"""The README's Quickstart, as a program to run: on `local` as written, and on another
provider with the one word it says to change."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

README = Path(__file__).parent.parent / "README.md"
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
