"""File transfer against a Pod that booby-traps its files or its `tar` (as root, as it may).

A download's archive is whatever the Pod's `tar` prints: here the workload replaces it
with a script that prints an archive crafted in Python.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from corral import ExecutionPlan
from corral.errors import ProviderError, UnsafeArchiveMember
from corral.providers.k8s import KubernetesEnvironment
from tests.hostile import (
    CHAIN,
    DOTDOT_AFTER_A_LINK,
    FILE,
    Member,
    crafted_tar,
    hardlink_chain,
    refused_download,
    sh,
)
from tests.integration.k8s.conftest import TEST_IMAGE

pytestmark = pytest.mark.anyio

PLAN = ExecutionPlan(image=TEST_IMAGE, workdir="/tmp")


@pytest.mark.parametrize(
    "members",
    [
        pytest.param(CHAIN, id="symlink-chain"),
        # From host/box/.corral-extract-*/ the chain's x is host/: x/outside/victim.
        pytest.param(hardlink_chain("outside/victim"), id="hardlink-through-chain"),
    ],
)
async def test_download_dir_refuses_what_a_replaced_tar_prints(
    k8s_env: KubernetesEnvironment, tmp_path: Path, members: list[Member]
) -> None:
    (tmp_path / "crafted.tar").write_bytes(crafted_tar(members))
    async with k8s_env.session(PLAN) as sandbox:
        await sandbox.upload(tmp_path / "crafted.tar", "/tmp/crafted.tar")
        await sandbox.write_text("/tmp/fake-tar", "#!/bin/sh\nexec cat /tmp/crafted.tar\n")
        await sh(sandbox, "cat /tmp/fake-tar > /usr/bin/tar && mkdir -p /tmp/down")
        await refused_download(sandbox, "/tmp/down", tmp_path / "host")


@pytest.mark.parametrize(
    "printed", ["not an archive at all", "cut", None], ids=["garbage", "cut-short", "empty"]
)
async def test_download_dir_names_what_a_replaced_tar_prints_that_is_no_archive(
    k8s_env: KubernetesEnvironment, tmp_path: Path, printed: str | None
) -> None:
    whole = crafted_tar([("a.txt", FILE, "", b"x" * 4096)])
    body = {"cut": whole[:700], None: b""}.get(printed, (printed or "").encode() * 50)
    (tmp_path / "printed").write_bytes(body)
    async with k8s_env.session(PLAN) as sandbox:
        await sandbox.upload(tmp_path / "printed", "/tmp/printed")
        await sandbox.write_text("/tmp/fake-tar", "#!/bin/sh\nexec cat /tmp/printed\n")
        await sh(sandbox, "cat /tmp/fake-tar > /usr/bin/tar && mkdir -p /tmp/down")
        with pytest.raises(ProviderError, match="'/tmp/down'.*malformed or cut short"):
            await sandbox.download_dir("/tmp/down", tmp_path / "host")
    assert not (tmp_path / "host").exists()


async def test_download_dir_refuses_dotdot_after_a_link(
    k8s_env: KubernetesEnvironment, tmp_path: Path
) -> None:
    async with k8s_env.session(PLAN) as sandbox:
        await sh(sandbox, f"mkdir -p /tmp/down && cd /tmp/down && {DOTDOT_AFTER_A_LINK}")
        await refused_download(sandbox, "/tmp/down", tmp_path)


async def test_upload_dir_never_writes_through_links_in_its_root(
    k8s_env: KubernetesEnvironment, tmp_path: Path
) -> None:
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "corral-probe").write_text("upload")
    (source / "corral-probe").write_text("upload")
    async with k8s_env.session(PLAN) as sandbox:
        await sh(sandbox, "mkdir -p /tmp/dst && ln -s /etc /tmp/dst/sub && ln -s / /tmp/to-root")
        with pytest.raises(UnsafeArchiveMember, match="/tmp/to-root"):
            await sandbox.upload_dir(source, "/tmp/to-root")
        await sandbox.upload_dir(source, "/tmp/dst")
        found = await sh(
            sandbox,
            "ls /corral-probe /etc/corral-probe 2>/dev/null; "
            "[ -L /tmp/dst/sub ] || cat /tmp/dst/sub/corral-probe",
        )
    assert found == "upload"
