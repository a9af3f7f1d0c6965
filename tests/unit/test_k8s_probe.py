"""The k8s policy probe fails closed: a dialler that cannot connect at all never reads as
"refused" (the script runs here with `sh`, against a stub or this host's busybox)."""

from __future__ import annotations

import ipaddress
import shutil
import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from corral.errors import ProviderError
from corral.providers.k8s import probe
from corral.providers.k8s.execution import Target
from corral.providers.k8s.probe import DIAL_SCRIPT, verdict


def _dial(bin_dir: Path, host: str, port: int, control: int) -> str:
    done = subprocess.run(
        ["sh", "-c", DIAL_SCRIPT, "sh", str(control), host, str(port)],
        env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_dialler_that_cannot_connect_is_not_a_refusal(tmp_path: Path) -> None:
    stub = tmp_path / "busybox"
    stub.write_text("#!/bin/sh\nexit 1\n")
    stub.chmod(0o755)
    output = _dial(tmp_path, "127.0.0.1", 9, _free_port())
    assert output.strip() == "control-failed"
    with pytest.raises(ProviderError, match="positive control"):
        verdict(output, "corral-x")


@pytest.mark.parametrize("output", ["", "refused\nconnected", "sh: busybox: not found"])
def test_anything_but_a_verdict_raises(output: str) -> None:
    with pytest.raises(ProviderError, match="could not probe"):
        verdict(output, "corral-x")


@pytest.mark.skipif(shutil.which("busybox") is None, reason="this host has no busybox")
def test_the_script_with_a_real_busybox(tmp_path: Path) -> None:
    busybox = shutil.which("busybox")
    assert busybox is not None
    (tmp_path / "busybox").symlink_to(busybox)
    with socket.create_server(("127.0.0.1", 0)) as server:
        open_port = server.getsockname()[1]
        opened = _dial(tmp_path, "127.0.0.1", open_port, _free_port())
    closed = _dial(tmp_path, "127.0.0.1", _free_port(), _free_port())
    assert (verdict(opened, "p"), verdict(closed, "p")) == (True, False)


@pytest.mark.anyio
async def test_dialling_several_at_once_raises_a_failed_control_as_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One dial whose control fails fails the whole check with its own ProviderError (not
    an ExceptionGroup a caller catching ProviderError would miss)."""

    async def run(target: object, argv: list[str], stdin: bytes | None = None) -> str:
        return "control-failed" if argv[-2] == "10.0.0.2" else "connected"

    monkeypatch.setattr(probe, "run", run)
    target = cast(Target, SimpleNamespace(pod="p"))
    first, second = ipaddress.ip_address("10.0.0.1"), ipaddress.ip_address("10.0.0.2")
    assert await probe.dial_each(target, [(first, 80)], "/d") == [True]
    with pytest.raises(ProviderError, match="positive control"):
        await probe.dial_each(target, [(first, 80), (second, 80)], "/d")
