"""Workspace bindings on a real Kubernetes cluster (scenarios in
tests/integration/workspace_cases), and against a Pod whose `tar` streams without end."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from corral import ExecutionPlan
from corral.errors import TransferLimitExceeded
from corral.providers.k8s import KubernetesEnvironment
from corral.workspace import SyncBinding
from tests.integration import workspace_cases as cases
from tests.integration.k8s.conftest import TEST_IMAGE
from tests.workspaces import leftovers, sh, tree, write_tree

pytestmark = pytest.mark.anyio

PLAN = ExecutionPlan(image=TEST_IMAGE, workdir="/tmp")


async def test_sync_back_with_each_conflict_policy(
    k8s_env: KubernetesEnvironment, tmp_path: Path
) -> None:
    async with k8s_env.session(PLAN) as sandbox:
        await cases.sync_back_with_each_policy(sandbox, tmp_path)


async def test_oversize_trees_are_refused_mid_stream(
    k8s_env: KubernetesEnvironment, tmp_path: Path
) -> None:
    async with k8s_env.session(PLAN) as sandbox:
        await cases.oversize_trees_are_refused_mid_stream(sandbox, tmp_path)


async def test_git_at_a_ref_and_a_fetched_refspec(
    k8s_env: KubernetesEnvironment, tmp_path: Path
) -> None:
    async with k8s_env.session(PLAN) as sandbox:
        await cases.git_at_a_ref_and_a_fetched_refspec(sandbox, tmp_path)


async def test_an_endless_archive_from_a_replaced_tar_is_cut_off(
    k8s_env: KubernetesEnvironment, tmp_path: Path
) -> None:
    """The archive is whatever the Pod's `tar` prints: here, small file headers without
    end. The stream is cut at max_archive_bytes, and nothing reaches the host source."""
    source = write_tree(tmp_path / "src", {"a.txt": "a\n"})
    header = tarfile.TarInfo("f")
    header.size = 0
    (tmp_path / "header").write_bytes(header.tobuf(format=tarfile.USTAR_FORMAT))
    binding = SyncBinding(source=source, path="/srv/ws", max_files=None, max_archive_bytes=4 << 20)
    async with k8s_env.session(PLAN) as sandbox:
        bound = await binding.bind(sandbox)
        await sandbox.upload(tmp_path / "header", "/tmp/header")
        await sandbox.write_text("/tmp/fake-tar", "#!/bin/sh\nwhile :; do cat /tmp/header; done\n")
        await sh(sandbox, "cat /tmp/fake-tar > /usr/bin/tar && echo agent > /srv/ws/a.txt")
        with pytest.raises(TransferLimitExceeded, match="max_archive_bytes"):
            await binding.finalize(bound)
        assert tree(source) == {"a.txt": "a\n"} and leftovers(source) == []
        assert await sh(sandbox, "echo still here") == "still here\n"
        binding.abandon(bound)
