"""On `local` every sandbox path corral writes, empties or syncs is inside the session's
own root: a plan written for a container never touches the host's directories."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from corral import ConfigError, ExecutionPlan, NetworkSchedule, TaskRun
from corral.providers.local import LocalEnvironment
from corral.providers.local.session import LocalSession
from corral.workspace import SyncBinding

pytestmark = pytest.mark.anyio


def _on_host(path: str) -> bool:
    return Path(path).exists()


def _local(session: object) -> LocalSession:
    assert isinstance(session, LocalSession)
    return session


async def test_a_binding_to_an_absolute_host_directory_leaves_it_untouched(
    tmp_path: Path,
) -> None:
    host = tmp_path / "project"  # a real host directory, named as the sandbox path
    host.mkdir()
    (host / "precious.txt").write_text("host data\n")
    source = tmp_path / "src"
    source.mkdir()
    (source / "task.txt").write_text("bound\n")
    plan = ExecutionPlan(workdir=str(host), network=NetworkSchedule())
    binding = SyncBinding(source=source, path=str(host))
    async with TaskRun(LocalEnvironment(), plan, bindings=[binding]) as run:
        root = _local(run.session).workspace
        assert sorted(p.name for p in host.iterdir()) == ["precious.txt"], "emptied by the bind"
        async with run.running() as sandbox:
            listed = await sandbox.exec("ls && echo agent >> task.txt")
        assert listed.stdout.split() == ["task.txt"], listed
        assert (await sandbox.exec(["pwd"])).stdout.strip() == str(root / str(host)[1:])
    assert sorted(p.name for p in host.iterdir()) == ["precious.txt"]
    assert (host / "precious.txt").read_text() == "host data\n"
    assert (source / "task.txt").read_text() == "bound\nagent\n", "synced back from the root"


async def test_file_calls_to_absolute_paths_land_in_the_session_root() -> None:
    name = f"/etc/corral-{uuid.uuid4().hex}"
    workdir = f"/work/corral-{uuid.uuid4().hex}"
    async with LocalEnvironment().session(ExecutionPlan(workdir=workdir)) as session:
        root = _local(session).workspace
        await session.write_text(f"{name}/f.txt", "in the root\n")
        assert await session.read_text(f"{name}/f.txt") == "in the root\n"
        assert (root / name[1:] / "f.txt").read_text() == "in the root\n"
        assert not _on_host(name), "the host's /etc is untouched"
        seen = await session.exec(["cat", str(root / name[1:] / "f.txt")])
        assert seen.stdout == "in the root\n", "a path the sandbox reports is used as it is"
        await session.remove(name)
        assert not (root / name[1:]).exists()
        assert (await session.exec(["pwd"])).stdout.strip() == str(root / workdir[1:])
    assert not _on_host(workdir), "the host has no such directory made"


async def test_paths_that_leave_the_root_are_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep\n")
    async with LocalEnvironment().session(ExecutionPlan()) as session:
        with pytest.raises(ConfigError, match=r"'\.\./\.\./x' leaves this session's root"):
            await session.write_text("../../x", "no")
        await session.exec(["ln", "-s", str(outside), "link"])
        with pytest.raises(ConfigError, match="'link/keep.txt' leaves .* through a symlink"):
            await session.read_text("link/keep.txt")
        with pytest.raises(ConfigError, match="through a symlink"):
            await session.upload_dir(tmp_path / "outside", "link/in")
        with pytest.raises(ConfigError, match="'link/new' leaves .* through a symlink"):
            await session.write_text("link/new", "no")
        await session.remove("link")  # the link goes, not what it points at
        assert (await session.exec(["ls"])).stdout == ""
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
