"""Wheel build hook: a wheel always carries the exec channel's helper, or the build fails.

The helper is a static Go binary (`helper/build.sh`). A wheel built without it would
install a corral whose sandboxes fall back to plain exec and lose what needs the helper
(allowlisted hostnames, network events), so a build that finds neither the binaries nor
a Go toolchain to make them stops here and says how to fix it. Editable installs (a
development checkout, `uv sync`) are exempt: `tests/run.sh` builds the helper itself.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

ARCHES = ("amd64", "arm64")


class HelperHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version == "editable":
            return
        root = Path(self.root)
        binaries = [root / f"src/corral/helper/bin/corral-exec-linux-{a}" for a in ARCHES]
        if all(b.is_file() for b in binaries):
            return
        script = root / "helper" / "build.sh"
        if script.is_file() and shutil.which("go"):
            subprocess.run(["bash", str(script)], check=True)
            return
        missing = ", ".join(b.name for b in binaries if not b.is_file())
        raise RuntimeError(
            f"corral's wheel must carry the exec helper, but {missing} is missing and no Go "
            "toolchain is on PATH to build it: run `bash helper/build.sh` first (or build "
            "from an sdist that carries it)"
        )
