"""Workspace binding scenarios, run against a real sandbox by the Docker and Kubernetes
tests: the agent is whatever `sh` does inside it, the host is this test process."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from corral.core.session import EnvironmentSession
from corral.errors import SyncBindingSourceConflictError, TransferLimitExceeded
from corral.workspace import GitRepositoryBinding, SyncBinding
from tests.workspaces import bare_repository, leftovers, sh, tree, write_tree

FILES = {"shared.txt": "base\n", "host_only.txt": "base\n", "gone.txt": "x\n", "d/deep.py": "1\n"}


async def sync_back_with_each_policy(sandbox: EnvironmentSession, tmp: Path) -> None:
    """Sync in, the agent edits, the host edits meanwhile, sync back by each policy."""
    for policy in ("overwrite", "fail", "keep_source"):
        source = write_tree(tmp / policy / "src", FILES)
        target = f"/srv/ws-{policy}"
        binding = SyncBinding(source=source, path=target, source_conflict_policy=policy)
        bound = await binding.bind(sandbox)
        listed = await sh(sandbox, f"cd {target} && find . -type f | sort && cat shared.txt")
        assert listed.split() == [
            "./d/deep.py",
            "./gone.txt",
            "./host_only.txt",
            "./shared.txt",
            "base",
        ]
        await sh(
            sandbox, f"cd {target} && echo agent > shared.txt && echo new > new.txt && rm gone.txt"
        )
        write_tree(source, {"shared.txt": "host\n", "host_only.txt": "host\n"})
        host_now = tree(source)

        if policy == "fail":
            with pytest.raises(SyncBindingSourceConflictError):
                await binding.finalize(bound)
            assert tree(source) == host_now and leftovers(source) == []
            assert binding.abandon(bound)
            continue
        snapshot = await binding.finalize(bound, outcome="completed")
        assert snapshot.sync is not None and snapshot.sync.source_changed
        assert snapshot.sync.deleted == ("gone.txt",)
        expected = {
            "shared.txt": "agent\n" if policy == "overwrite" else "host\n",
            "host_only.txt": "host\n",
            "new.txt": "new\n",
            "d/deep.py": "1\n",
        }
        assert tree(source) == expected and leftovers(source) == []


async def oversize_trees_are_refused_mid_stream(sandbox: EnvironmentSession, tmp: Path) -> None:
    """A 2 GiB (sparse) file and a tree of too many files are refused while they stream:
    the host source is as it was, nothing is left beside it, and the sandbox still works."""
    source = write_tree(tmp / "src", FILES)
    binding = SyncBinding(source=source, path="/srv/big", max_file_bytes=1 << 20, max_files=100)
    bound = await binding.bind(sandbox)
    before = tree(source)
    await sh(sandbox, "cd /srv/big && echo agent > shared.txt && truncate -s 2G big")
    started = time.monotonic()
    with pytest.raises(TransferLimitExceeded, match="max_file_bytes"):
        await binding.finalize(bound)
    # Reading 2 GiB through the transport takes far longer; the header alone was read.
    assert time.monotonic() - started < 30
    await sh(sandbox, "cd /srv/big && rm big && mkdir many && cd many && seq 200 | xargs touch")
    with pytest.raises(TransferLimitExceeded, match="max_files=100"):
        await binding.finalize(bound)
    assert tree(source) == before and leftovers(source) == []

    await sh(sandbox, "rm -r /srv/big/many")
    snapshot = await binding.finalize(bound)  # the sandbox and the binding still work
    assert snapshot.sync is not None and snapshot.sync.written == ("shared.txt",)
    assert (source / "shared.txt").read_text() == "agent\n"


async def git_at_a_ref_and_a_fetched_refspec(sandbox: EnvironmentSession, tmp: Path) -> None:
    """Cloned on the harness side (the image has no git), checked out at a tag and at a
    pull-request head; the agent's edits come back as the dirty state and a patch, and a
    `.git/config` it plants to run a command on the harness runs nothing."""
    repo, commits = bare_repository(tmp / "repos")
    at_tag = GitRepositoryBinding(repo_url=str(repo), ref="v1", path="/srv/repo")
    bound = await at_tag.bind(sandbox)
    assert await sh(sandbox, "cat /srv/repo/src/app.py") == "print(1)\n"
    marker = tmp / "ran"
    await sh(
        sandbox,
        "cd /srv/repo && echo 'print(3)' > src/app.py && echo n > NEW && "
        f"printf '[core]\\n\\tfsmonitor = touch {marker}\\n' >> .git/config",
    )
    snapshot = await at_tag.finalize(bound)
    state = snapshot.git
    assert state is not None
    assert (state.commit, state.branch, state.dirty) == (commits["v1"], None, True)
    assert state.changed_paths == ("NEW", "src/app.py")
    assert "+print(3)" in state.diff
    assert not marker.exists()

    pull = GitRepositoryBinding(
        repo_url=str(repo),
        ref="pr-7",
        fetch_refspecs=("+refs/pull/7/head:refs/heads/pr-7",),
        path="/srv/pr",
    )
    bound = await pull.bind(sandbox)
    assert await sh(sandbox, "cat /srv/pr/src/app.py") == "print('pr')\n"
    clean = await pull.finalize(bound)
    assert clean.git is not None
    assert (clean.git.commit, clean.git.branch, clean.git.dirty) == (commits["pr"], "pr-7", False)


#: what the agent puts where the image's `rm` was: it removes nothing and says it worked
NO_OP_RM = "#!/bin/sh\nexit 0\n"


async def the_target_is_emptied_by_corrals_own_rm(sandbox: EnvironmentSession, tmp: Path) -> None:
    """The agent, as root, plants a file where a binding lands and replaces the image's
    `rm` with a no-op: binding there again still leaves only what is bound (the target is
    emptied by corral's own `rm`). On 8c0b629 the planted file stayed."""
    target = "/srv/ws-rm"
    await sandbox.write_text("/tmp/no-op-rm", NO_OP_RM)
    await sh(
        sandbox,
        f"mkdir -p {target} && echo planted > {target}/planted.txt && "
        'p=$(command -v rm) && rm -f "$p" && cp /tmp/no-op-rm "$p" && chmod 755 "$p"',
    )
    assert await sh(sandbox, f"rm {target}/planted.txt; ls {target}") == "planted.txt\n"
    source = write_tree(tmp / "src", {"bound.txt": "host\n"})
    await SyncBinding(source=source, path=target).bind(sandbox)
    assert (await sh(sandbox, f"ls -A {target}")).split() == ["bound.txt"]


SessionCase = Callable[[EnvironmentSession, Path], Awaitable[None]]

#: the scenarios that take one session of the provider's default config and a tmp dir
SESSION_CASES: tuple[SessionCase, ...] = (
    sync_back_with_each_policy,
    oversize_trees_are_refused_mid_stream,
    the_target_is_emptied_by_corrals_own_rm,
    git_at_a_ref_and_a_fetched_refspec,
)
