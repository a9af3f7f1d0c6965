"""Exec and file transfer on a real engine, as root and as a non-root sandbox user.

Each check here once failed: Inspect's sandbox suite (tests/integration/adapters) found them.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from corral import ExecutionPlan, RemotePathNotFound
from tests.integration.docker.conftest import TEST_IMAGE, make_env

pytestmark = pytest.mark.anyio

PLAN = ExecutionPlan(image=TEST_IMAGE, workdir="/tmp")


@pytest.mark.parametrize("user", [None, "corral"])
async def test_a_timeout_kills_the_tree_of_any_user(owner: str, user: str | None) -> None:
    async with make_env(owner, user=user).session(PLAN) as sandbox:
        result = await sandbox.exec("sleep 30 & sleep 30 # corral-tree-mark", timeout=1)
        assert result.timed_out
        await anyio.sleep(1)
        left = await sandbox.exec("ps -eo args | grep -c '[s]leep 30'")
        assert left.stdout.strip() == "0", "processes outlived the timeout"


@pytest.mark.parametrize("channel", [True, False], ids=["channel", "plain"])
async def test_a_command_that_never_stops_printing_still_times_out(
    owner: str, channel: bool
) -> None:
    """Reads take what is there without waiting for the selector: a stream that never
    pauses must still let the timeout land, and the output stays bounded."""
    async with make_env(owner, exec_channel=channel).session(PLAN) as sandbox:
        started = anyio.current_time()
        result = await sandbox.exec("yes corral-never-stops", timeout=1.5)
        elapsed = anyio.current_time() - started
        assert result.timed_out and result.stdout_truncated
        assert result.stdout.startswith("corral-never-stops\n")
        assert elapsed < 10, f"a timeout of 1.5 s took {elapsed:.1f} s"


async def test_root_keeps_its_capabilities_in_a_non_root_sandbox(owner: str) -> None:
    async with make_env(owner, user="corral").session(PLAN) as sandbox:
        assert (await sandbox.exec(["id", "-un"])).stdout == "corral\n"
        status = await sandbox.exec(["grep", "CapEff", "/proc/self/status"], user="0")
        assert status.stdout.split()[1] != "0000000000000000"


async def test_an_unknown_user_is_named_in_the_output(owner: str) -> None:
    async with make_env(owner).session(PLAN) as sandbox:
        for _ in range(5):  # the engine's message arrives with the HTTP headers
            result = await sandbox.exec(["whoami"], user="nobody-here")
            assert result.returncode != 0 and "nobody-here" in result.stdout + result.stderr


async def test_a_refused_download_does_not_wedge_the_sandbox(owner: str, tmp_path: Path) -> None:
    async with make_env(owner).session(PLAN) as sandbox:
        with pytest.raises(IsADirectoryError):
            await sandbox.download("/usr", tmp_path / "usr")
        with anyio.fail_after(20), pytest.raises(RemotePathNotFound, match="missing.txt"):
            await sandbox.download("missing.txt", tmp_path / "missing.txt")
