"""Workspace bindings on a real Kubernetes cluster (scenarios in
tests/integration/workspace_cases), and against a Pod whose `tar` streams without end."""

from __future__ import annotations

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


@pytest.mark.parametrize("case", cases.SESSION_CASES, ids=lambda case: case.__name__)
async def test_workspace_case(
    k8s_env: KubernetesEnvironment,
    tmp_path: Path,
    case: cases.SessionCase,
) -> None:
    async with k8s_env.session(PLAN) as sandbox:
        await case(sandbox, tmp_path)


async def test_an_archive_past_its_limit_is_cut_off(
    k8s_env: KubernetesEnvironment, tmp_path: Path
) -> None:
    """The sandbox chooses what its workspace holds: here more than max_archive_bytes. The
    stream is cut at the limit, and nothing reaches the host source."""
    source = write_tree(tmp_path / "src", {"a.txt": "a\n"})
    binding = SyncBinding(source=source, path="/srv/ws", max_files=None, max_archive_bytes=4 << 20)
    async with k8s_env.session(PLAN) as sandbox:
        bound = await binding.bind(sandbox)
        await sh(
            sandbox,
            "echo agent > /srv/ws/a.txt && for i in $(seq 600); do "
            "head -c 10000 /dev/urandom > /srv/ws/f$i; done",
        )
        with pytest.raises(TransferLimitExceeded, match="max_archive_bytes"):
            await binding.finalize(bound)
        assert tree(source) == {"a.txt": "a\n"} and leftovers(source) == []
        assert await sh(sandbox, "echo still here") == "still here\n"
        binding.abandon(bound)
