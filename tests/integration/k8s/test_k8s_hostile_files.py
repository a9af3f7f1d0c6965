"""File transfer against a Pod that booby-traps its files or its `tar` (as root, as it may).

In the sandbox container corral's own busybox packs and unpacks, so a replaced `tar` is
never run there. A service's files still go through its image's `tar`: a download's
archive from a service is whatever that prints, here a script that prints an archive
crafted in Python, and corral's extractor must refuse it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from corral import ExecutionPlan
from corral.core.plan import ServiceSpec
from corral.errors import ProviderError
from corral.providers.k8s import KubernetesEnvironment
from tests.hostile import (
    CHAIN,
    FILE,
    Member,
    a_dotdot_after_a_link_is_refused,
    crafted_tar,
    hardlink_chain,
    refused_download,
    sh,
    upload_dir_never_writes_through_links_in_its_root,
)
from tests.integration.k8s.conftest import TEST_IMAGE

pytestmark = pytest.mark.anyio

PLAN = ExecutionPlan(image=TEST_IMAGE, workdir="/tmp")
#: a service whose `tar` the tests replace (services run their image's own tools)
BOX = "box"
BOXED = PLAN.model_copy(
    update={"services": {BOX: ServiceSpec(image=TEST_IMAGE, command=["sleep", "infinity"])}}
)


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
    async with k8s_env.session(BOXED) as sandbox:
        await sandbox.upload(tmp_path / "crafted.tar", "/tmp/crafted.tar", service=BOX)
        fake = "#!/bin/sh\nexec cat /tmp/crafted.tar\n"
        await sandbox.write_text("/tmp/fake-tar", fake, service=BOX)
        await sh(sandbox, "cat /tmp/fake-tar > /usr/bin/tar && mkdir -p /tmp/down", BOX)
        await refused_download(sandbox, "/tmp/down", tmp_path / "host", BOX)


@pytest.mark.parametrize(
    "printed", ["not an archive at all", "cut", None], ids=["garbage", "cut-short", "empty"]
)
async def test_download_dir_names_what_a_replaced_tar_prints_that_is_no_archive(
    k8s_env: KubernetesEnvironment, tmp_path: Path, printed: str | None
) -> None:
    whole = crafted_tar([("a.txt", FILE, "", b"x" * 4096)])
    body = {"cut": whole[:700], None: b""}.get(printed, (printed or "").encode() * 50)
    (tmp_path / "printed").write_bytes(body)
    async with k8s_env.session(BOXED) as sandbox:
        await sandbox.upload(tmp_path / "printed", "/tmp/printed", service=BOX)
        fake = "#!/bin/sh\nexec cat /tmp/printed\n"
        await sandbox.write_text("/tmp/fake-tar", fake, service=BOX)
        await sh(sandbox, "cat /tmp/fake-tar > /usr/bin/tar && mkdir -p /tmp/down", BOX)
        with pytest.raises(ProviderError, match="'/tmp/down'.*malformed or cut short"):
            await sandbox.download_dir("/tmp/down", tmp_path / "host", service=BOX)
    assert not (tmp_path / "host").exists()


async def test_a_replaced_tar_in_the_sandbox_is_never_run(
    k8s_env: KubernetesEnvironment, tmp_path: Path
) -> None:
    """Security round 3: corral's file calls in the sandbox container run corral's busybox,
    so the workload's `tar`, `head`, `sh` and `dd` on the PATH stand in for nothing."""
    (tmp_path / "up" / "d").mkdir(parents=True)
    (tmp_path / "up" / "d" / "f.txt").write_text("up")
    fake = '#!/bin/sh\necho "$0" >> /tmp/ran\nexec /bin/false\n'
    async with k8s_env.session(PLAN) as sandbox:
        await sandbox.write_text("/tmp/fake", fake)
        await sh(
            sandbox,
            "chmod 755 /tmp/fake && for t in tar head dd wc mkdir xargs; do "
            "cp /tmp/fake /usr/local/bin/$t; done",
        )
        await sandbox.upload_dir(tmp_path / "up", "/tmp/up")
        await sandbox.download_dir("/tmp/up", tmp_path / "down")
        await sandbox.write_text("/tmp/up/g.txt", "g")
        text = await sandbox.read_text("/tmp/up/g.txt")
        ran = await sandbox.exec(["/bin/cat", "/tmp/ran"])
    assert ran.stdout == "", ran
    assert text == "g" and (tmp_path / "down" / "d" / "f.txt").read_text() == "up"


async def test_download_dir_refuses_dotdot_after_a_link(
    k8s_env: KubernetesEnvironment, tmp_path: Path
) -> None:
    async with k8s_env.session(PLAN) as sandbox:
        await a_dotdot_after_a_link_is_refused(sandbox, tmp_path)


async def test_upload_dir_never_writes_through_links_in_its_root(
    k8s_env: KubernetesEnvironment, tmp_path: Path
) -> None:
    async with k8s_env.session(PLAN) as sandbox:
        await upload_dir_never_writes_through_links_in_its_root(sandbox, tmp_path)
