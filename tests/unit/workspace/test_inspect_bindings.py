"""The Inspect adapter's config carries bindings: bound at sample_init, finalized at
sample_cleanup, abandoned (nothing synced back) when the sample was interrupted."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.adapters.inspect import CorralSandboxConfig, CorralSandboxEnvironment
from corral.workspace import SyncOptions
from tests.workspaces import tree, write_tree

pytestmark = pytest.mark.anyio


def _config(source: Path, target: Path) -> CorralSandboxConfig:
    as_json: dict[str, object] = {
        "provider": "local",
        "plan": {},
        "bindings": [
            {"kind": "sync", "source": str(source), "path": str(target)},
            {"kind": "none"},
        ],
    }
    return CorralSandboxConfig.model_validate_json(
        CorralSandboxConfig.model_validate(as_json).model_dump_json()
    )


@pytest.mark.parametrize("interrupted", [False, True])
async def test_bound_at_init_and_finalized_at_cleanup(tmp_path: Path, interrupted: bool) -> None:
    source = write_tree(tmp_path / "src", {"task.txt": "open\n"})
    target = tmp_path / "sandbox-ws"
    config = _config(source, target)
    assert isinstance(config.bindings[0], SyncOptions)

    envs = await CorralSandboxEnvironment.sample_init("bindings", config, {})
    sandbox = envs["default"]
    assert await sandbox.read_file(str(target / "task.txt")) == "open\n"
    await sandbox.write_file(str(target / "task.txt"), "done\n")
    await CorralSandboxEnvironment.sample_cleanup("bindings", config, envs, interrupted)

    assert tree(source) == {"task.txt": "open\n" if interrupted else "done\n"}
    # Released either way, and by task_cleanup too: later samples bind the same source.
    await CorralSandboxEnvironment.sample_init("bindings", config, {})
    await CorralSandboxEnvironment.task_cleanup("bindings", config, True)
    last = await CorralSandboxEnvironment.sample_init("bindings", config, {})
    await CorralSandboxEnvironment.sample_cleanup("bindings", config, last, False)
