"""File transfer against a sandbox that booby-traps its filesystem (as root, as it may).

The archive of a download is made by the engine from the sandbox's files, so the trees
here are built in the sandbox; an upload must not write through the links it left.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from corral import ExecutionPlan
from corral.errors import UnsafeArchiveMember
from tests.hostile import (
    a_dotdot_after_a_link_is_refused,
    escaping_links,
    host_tree,
    refused_download,
    sh,
    snapshot,
    upload_dir_never_writes_through_links_in_its_root,
)
from tests.integration.docker.conftest import TEST_IMAGE, make_env

pytestmark = pytest.mark.anyio

PLAN = ExecutionPlan(image=TEST_IMAGE, workdir="/tmp")


async def test_download_dir_refuses_chains_of_links(owner: str, tmp_path: Path) -> None:
    # `s -> .` makes s/s/x the directory's own x, then pointed two levels up.
    tree = "ln -s . s && ln -s ../.. s/s/x && echo through > x/FILE"
    async with make_env(owner).session(PLAN) as sandbox:
        await sh(sandbox, f"mkdir -p /tmp/t/down && cd /tmp/t/down && {tree}")
        await refused_download(sandbox, "/tmp/t/down", tmp_path)


async def test_download_dir_refuses_dotdot_after_a_link(owner: str, tmp_path: Path) -> None:
    async with make_env(owner).session(PLAN) as sandbox:
        await a_dotdot_after_a_link_is_refused(sandbox, tmp_path)


async def test_download_dir_lands_hard_links_inside(owner: str, tmp_path: Path) -> None:
    dest = host_tree(tmp_path)
    before = snapshot(tmp_path, skip=dest)
    async with make_env(owner).session(PLAN) as sandbox:
        await sh(
            sandbox,
            "mkdir -p /tmp/t/down/s && cd /tmp/t/down && echo ok > ok.txt && ln ok.txt s/hl "
            "&& echo outer > /tmp/outer && ln /tmp/outer h2 && ln -s ../ok.txt s/up",
        )
        await sandbox.download_dir("/tmp/t/down", dest)
    assert snapshot(tmp_path, skip=dest) == before
    assert escaping_links(dest) == []
    assert (dest / "s" / "hl").samefile(dest / "ok.txt")
    assert (dest / "s" / "up").read_text() == "ok\n"
    assert (dest / "h2").read_text() == "outer\n"


async def test_upload_dir_never_writes_through_links_in_its_root(
    owner: str, tmp_path: Path
) -> None:
    async with make_env(owner).session(PLAN) as sandbox:
        await upload_dir_never_writes_through_links_in_its_root(sandbox, tmp_path)


async def test_uploads_never_write_through_links_the_workload_made(
    owner: str, tmp_path: Path
) -> None:
    (tmp_path / "file").write_text("upload")
    async with make_env(owner).session(PLAN) as sandbox:
        await sh(
            sandbox,
            "ln -s /etc /tmp/to-etc && echo keep > /etc/victim && ln -s /etc/victim /tmp/f "
            "&& rm /sbin && ln -s /etc /sbin",
        )
        with pytest.raises(UnsafeArchiveMember, match="/tmp/to-etc"):
            await sandbox.upload(tmp_path / "file", "/tmp/to-etc/new/corral-probe")
        with pytest.raises(UnsafeArchiveMember, match="/tmp/to-etc"):
            await sandbox.write_text("/tmp/to-etc/corral-probe", "upload")
        with pytest.raises(UnsafeArchiveMember, match="'/sbin'"):
            await sandbox.write_text("/sbin/corral-probe", "upload")
        await sandbox.upload(tmp_path / "file", "/tmp/f")
        found = await sh(
            sandbox, "ls /etc/new 2>/dev/null; cat /etc/victim; [ -L /tmp/f ] || cat /tmp/f"
        )
    assert found == "keep\nupload"


async def test_uploads_follow_the_images_own_links(owner: str, tmp_path: Path) -> None:
    (tmp_path / "tool").write_text("tool")
    async with make_env(owner).session(PLAN) as sandbox:
        await sandbox.upload(tmp_path / "tool", "/bin/corral-tool")  # /bin -> usr/bin
        await sandbox.write_text("/lib/corral/new/note", "note")  # /lib -> usr/lib
        found = await sh(sandbox, "cat /usr/bin/corral-tool /usr/lib/corral/new/note")
    assert found == "toolnote"
