"""GitRepositoryBinding on the `local` provider, against local bare repositories: a ref,
a fetched pull-request head, the dirty state, and a sandbox `.git` that is never trusted."""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio
import pytest

from corral.errors import ConfigError, ProviderError
from corral.providers.local.session import LocalSession
from corral.workspace import GitRepositoryBinding
from tests.workspaces import bare_repository, commit, git, sh, tree

pytestmark = pytest.mark.anyio


@pytest.fixture
def origin(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    return bare_repository(tmp_path / "repos")


async def test_at_a_tag_clean_then_dirty(
    local: LocalSession, ws: str, origin: tuple[Path, dict[str, str]]
) -> None:
    repo, commits = origin
    binding = GitRepositoryBinding(repo_url=str(repo), ref="v1", path=ws)
    bound = await binding.bind(local)
    assert bound.revision == commits["v1"]
    assert (Path(ws) / "src/app.py").read_text() == "print(1)\n"
    clean = await binding.observe_revision(bound)
    assert clean.git is not None and not clean.git.dirty and clean.git.diff == ""

    await sh(local, f"cd {ws} && echo 'print(3)' > src/app.py && echo new > NEW && rm README")
    snapshot = await binding.finalize(bound, outcome="completed")

    state = snapshot.git
    assert state is not None
    assert (state.commit, state.branch, state.dirty) == (commits["v1"], None, True)
    assert state.changed_paths == ("NEW", "README", "src/app.py")
    assert "+print(3)" in state.diff and "-print(1)" in state.diff and "deleted file" in state.diff
    assert snapshot.snapshot_id != clean.revision


async def test_default_head_and_a_branch(
    local: LocalSession, ws: str, origin: tuple[Path, dict[str, str]]
) -> None:
    repo, commits = origin
    for ref, branch in ((None, "main"), ("feature", "feature")):
        binding = GitRepositoryBinding(repo_url=str(repo), ref=ref, path=ws)
        bound = await binding.bind(local)
        assert bound.revision == commits[branch]
        assert git(Path(ws), "rev-parse", "--abbrev-ref", "HEAD") == branch
        snapshot = await binding.finalize(bound)
        assert snapshot.git is not None
        assert (snapshot.git.branch, snapshot.git.dirty) == (branch, False)


async def test_a_pull_request_head_needs_its_refspec(
    local: LocalSession, ws: str, origin: tuple[Path, dict[str, str]]
) -> None:
    repo, commits = origin
    with pytest.raises(ConfigError, match="'pr-7' is not a branch.*fetch_refspecs"):
        await GitRepositoryBinding(repo_url=str(repo), ref="pr-7", path=ws).bind(local)
    binding = GitRepositoryBinding(
        repo_url=str(repo),
        ref="pr-7",
        fetch_refspecs=("+refs/pull/7/head:refs/heads/pr-7",),
        path=ws,
    )
    bound = await binding.bind(local)
    assert bound.revision == commits["pr"]
    assert (Path(ws) / "src/app.py").read_text() == "print('pr')\n"
    await sh(local, f"echo review >> {ws}/src/app.py")
    snapshot = await binding.finalize(bound)
    assert snapshot.git is not None
    assert (snapshot.git.branch, snapshot.git.dirty) == ("pr-7", True)


async def test_the_sandbox_git_directory_is_never_read(
    local: LocalSession, ws: str, origin: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """The agent commits (so its HEAD moves), and plants config that would run a command
    if the harness ran git on its `.git` (fsmonitor, hooks, a clean filter): the diff is
    still taken against the bound commit, and nothing runs."""
    repo, commits = origin
    binding = GitRepositoryBinding(repo_url=str(repo), path=ws)
    bound = await binding.bind(local)
    marker = tmp_path / "ran"
    hostile = f"sh -c 'touch {marker}'"
    workdir = Path(ws)
    commit(workdir, {"src/app.py": "agent\n"}, "agent commit")
    git(workdir, "config", "core.fsmonitor", hostile)
    git(workdir, "config", "filter.evil.clean", hostile)
    (workdir / ".gitattributes").write_text("* filter=evil\n")
    hook = workdir / ".git/hooks/post-index-change"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
    hook.chmod(0o755)
    nested = workdir / "vendored"
    nested.mkdir()
    git(nested, "init", "-q")
    git(nested, "config", "core.fsmonitor", hostile)

    snapshot = await binding.finalize(bound)

    assert not marker.exists()
    state = snapshot.git
    assert state is not None and state.commit == commits["main"] and state.dirty
    assert state.changed_paths == (".gitattributes", "src/app.py")


async def test_require_clean_and_verify_remote_url(
    local: LocalSession,
    ws: str,
    origin: tuple[Path, dict[str, str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    repo, commits = origin
    checkout = tmp_path / "checkout"
    git(tmp_path, "clone", "-q", str(repo), str(checkout))
    (checkout / "README").write_text("uncommitted\n")
    with pytest.raises(ConfigError, match="uncommitted changes.*README"):
        await GitRepositoryBinding(repo_url=str(checkout), path=ws).bind(local)
    lenient = GitRepositoryBinding(repo_url=str(checkout), path=ws, require_clean=False)
    lenient.abandon(await lenient.bind(local))

    # A url rewrite in the user's config sends the clone somewhere else.
    elsewhere = tmp_path / "elsewhere.git"
    shutil.copytree(repo, elsewhere)
    config = tmp_path / "gitconfig"
    config.write_text(f'[url "{elsewhere}"]\n\tinsteadOf = {repo}\n')
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    with pytest.raises(ConfigError, match="elsewhere.git.*insteadOf"):
        await GitRepositoryBinding(repo_url=str(repo), path=ws).bind(local)
    trusting = GitRepositoryBinding(repo_url=str(repo), path=ws, verify_remote_url=False)
    bound = await trusting.bind(local)
    assert bound.revision == commits["main"]
    trusting.abandon(bound)


async def test_the_diff_is_bounded(
    local: LocalSession, ws: str, origin: tuple[Path, dict[str, str]]
) -> None:
    repo, _ = origin
    binding = GitRepositoryBinding(repo_url=str(repo), path=ws, max_diff_bytes=100)
    bound = await binding.bind(local)
    await sh(local, f"seq 1000 > {ws}/numbers")
    snapshot = await binding.finalize(bound)
    assert snapshot.git is not None
    assert len(snapshot.git.diff) == 100 and snapshot.git.diff_truncated


async def test_credentials_in_the_url_never_reach_errors_or_the_sandbox(
    local: LocalSession,
    ws: str,
    origin: tuple[Path, dict[str, str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = "http://user:s3cret@127.0.0.1:9/x.git"  # nothing listens on the discard port
    binding = GitRepositoryBinding(repo_url=url, path=ws)
    with pytest.raises(ProviderError) as failure:
        await binding.bind(local)
    assert "s3cret" not in str(failure.value)
    assert "s3cret" not in repr(binding)
    assert not await anyio.Path(ws).exists()

    # The user's config serves that URL from a local repository: the clone works, and
    # the copy in the sandbox names its remote without the credentials.
    config = tmp_path / "gitconfig"
    config.write_text(f'[url "{origin[0]}"]\n\tinsteadOf = {url}\n')
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    binding = GitRepositoryBinding(repo_url=url, path=ws, verify_remote_url=False)
    bound = await binding.bind(local)
    assert bound.source == "http://127.0.0.1:9/x.git"
    assert "s3cret" not in (Path(ws) / ".git/config").read_text()
    assert "127.0.0.1:9/x.git" in (Path(ws) / ".git/config").read_text()
    binding.abandon(bound)


async def test_bad_options_name_the_value(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'--upload-pack=x'"):
        GitRepositoryBinding(repo_url="--upload-pack=x")
    with pytest.raises(ValueError, match="ref '-x'"):
        GitRepositoryBinding(repo_url=str(tmp_path), ref="-x")
    with pytest.raises(ValueError, match="refspec"):
        GitRepositoryBinding(repo_url=str(tmp_path), fetch_refspecs=("+--all",))
    assert tree(tmp_path) == {}
