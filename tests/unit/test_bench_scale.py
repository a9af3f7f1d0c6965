"""The scale case's picture: both curves drawn to a PNG of the size the README shows."""

from __future__ import annotations

import struct
from pathlib import Path

from bench.cases.docker_scale import draw


def test_the_curves_are_drawn_to_a_png(tmp_path: Path) -> None:
    path = tmp_path / "scale.png"
    draw({"corral": [0.9 + n / 1000 for n in range(300)], "docker-py": [0.3] * 300}, path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (700, 350)
