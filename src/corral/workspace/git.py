"""`GitRepositoryBinding`: a repository checked out at a ref, cloned by the harness."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit, urlunsplit

import anyio
from pydantic import Field, field_validator

from corral.core.session import EnvironmentSession
from corral.errors import ConfigError
from corral.workspace import reservations
from corral.workspace.base import Binding, LimitedOptions
from corral.workspace.gitcli import git, text
from corral.workspace.models import BoundWorkspace, GitState, WorkspaceRevision, WorkspaceSnapshot
from corral.workspace.retrieve import remove_tree, retrieved

MAX_CHANGED_PATHS = 1000


def _option_safe(value: str, what: str) -> str:
    if not value or value.startswith("-") or any(c in value for c in "\0\n\r"):
        raise ValueError(f"{what} {value!r} must be non-empty, not start with '-', and be one line")
    return value


class GitOptions(LimitedOptions):
    kind: Literal["git"] = "git"
    repo_url: str = Field(description="the repository to clone: a URL or a host path")
    ref: str | None = Field(
        default=None, description="branch, tag or commit to check out (default: the remote's HEAD)"
    )
    remote_name: str = Field(default="origin", description="the clone's name for repo_url")
    fetch_refspecs: tuple[str, ...] = Field(
        default=(),
        description="refs to fetch beyond the clone's, e.g. '+refs/pull/1/head:refs/heads/pr-1'",
    )
    require_clean: bool = Field(
        default=True, description="refuse a host repo_url with uncommitted changes"
    )
    verify_remote_url: bool = Field(
        default=True, description="refuse a clone whose remote is not repo_url (url rewrites)"
    )
    timeout_s: float = Field(default=120.0, gt=0, description="seconds for each git command")
    max_diff_bytes: int = Field(
        default=1024 * 1024, ge=0, description="bytes of the agent's patch kept in the snapshot"
    )

    def __repr_args__(self) -> Iterable[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():
            yield name, without_credentials(value) if name == "repo_url" else value

    @field_validator("repo_url", "remote_name")
    @classmethod
    def _safe(cls, value: str) -> str:
        return _option_safe(value, "value")

    @field_validator("ref")
    @classmethod
    def _ref(cls, value: str | None) -> str | None:
        return None if value is None else _option_safe(value, "ref")

    @field_validator("fetch_refspecs")
    @classmethod
    def _refspecs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for refspec in value:
            _option_safe(refspec.removeprefix("+"), "refspec")
        return value


def without_credentials(url: str) -> str:
    """`url` without its user and password, for reprs, errors and the sandbox's remote."""
    parts = urlsplit(url)
    if not parts.scheme or "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


@dataclass(frozen=True)
class _Bind:
    clone: Path  # the harness's clone; removed when the bind is released
    path: str
    commit: str
    branch: str | None


class GitRepositoryBinding(Binding[GitOptions, _Bind]):
    """Clone `repo_url` on the harness side (so sandboxes without a network work), check
    out `ref`, and copy the repository into the sandbox. It never commits or pushes.

    What comes back is judged by the harness alone: finalize brings the sandbox's tree
    back under the limits, drops every `.git` in it unread, and diffs the rest against
    the bound commit with the host's git in its isolated mode. What the agent committed
    inside the sandbox shows in that diff; its history and config are never trusted.
    """

    kind: ClassVar[str] = "git"
    options_model = GitOptions

    async def bind(self, session: EnvironmentSession, *, path: str | None = None) -> BoundWorkspace:
        target = self.options.sandbox_path(path)
        key = reservations.reserve(reservations.sandbox(session.id, target))
        holder = Path(
            await anyio.to_thread.run_sync(lambda: tempfile.mkdtemp(prefix="corral-git-"))
        )
        try:
            state = await self._checkout(holder / "repo", target)
            await session.remove(target)  # the image's files there: only what is bound stays
            await session.upload_dir(state.clone, target)
        except BaseException:
            reservations.release(key)
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(remove_tree, holder)
            raise
        self._adopt(key, session, state)
        return BoundWorkspace(
            binding="git",
            session_id=session.id,
            path=target,
            source=without_credentials(self.options.repo_url),
            revision=state.commit,
            state_key=key,
        )

    async def _checkout(self, clone: Path, target: str) -> _Bind:
        options = self.options
        url = options.repo_url
        local = await anyio.to_thread.run_sync(lambda: Path(url).is_dir())
        if local:
            url = str(await anyio.to_thread.run_sync(lambda: Path(url).resolve()))
            if options.require_clean:
                await self._refuse_dirty(Path(url))
        public = without_credentials(url)
        hide = (url, public)
        run = options.timeout_s
        await git(
            "clone",
            "--no-checkout",
            "--quiet",
            "--origin",
            options.remote_name,
            "--",
            url,
            str(clone),
            timeout_s=run,
            hide=hide,
        )
        if options.verify_remote_url:
            actual = text(
                await git("remote", "get-url", options.remote_name, cwd=clone, timeout_s=run)
            )
            if actual != url:
                raise ConfigError(
                    f"the clone's remote {options.remote_name!r} is "
                    f"{without_credentials(actual)!r}, not {public!r} (a url.insteadOf "
                    "rewrite?); verify_remote_url=False accepts it"
                )
        if options.fetch_refspecs:
            await git(
                "fetch",
                "--quiet",
                "--update-head-ok",
                options.remote_name,
                *options.fetch_refspecs,
                cwd=clone,
                timeout_s=run,
                hide=hide,
            )
        commit, branch = await self._resolve(clone)
        if branch is None:
            await git(
                "checkout", "--quiet", "--force", "--detach", commit, cwd=clone, timeout_s=run
            )
        else:
            await git(
                "checkout", "--quiet", "--force", "-B", branch, commit, cwd=clone, timeout_s=run
            )
        if public != url:
            await git("remote", "set-url", options.remote_name, public, cwd=clone, timeout_s=run)
        return _Bind(clone, target, commit, branch)

    async def _refuse_dirty(self, repo: Path) -> None:
        bare = await git(
            "rev-parse", "--is-bare-repository", cwd=repo, timeout_s=self.options.timeout_s
        )
        if text(bare) == "true":
            return
        status = text(
            await git("status", "--porcelain", cwd=repo, timeout_s=self.options.timeout_s)
        )
        if status:
            first = status.splitlines()[0]
            raise ConfigError(
                f"repository {str(repo)!r} has uncommitted changes (first: {first!r}) that a clone "
                "would not carry; commit them, or require_clean=False"
            )

    async def _resolve(self, clone: Path) -> tuple[str, str | None]:
        """The commit `ref` names, and the branch to check it out on (None: detached)."""
        options = self.options
        run = options.timeout_s

        async def commit_of(name: str) -> str | None:
            found = await git(
                "rev-parse",
                "--verify",
                "--quiet",
                "--end-of-options",
                f"{name}^{{commit}}",
                cwd=clone,
                timeout_s=run,
                check=False,
            )
            return text(found) if found.returncode == 0 else None

        ref = options.ref
        if ref is None:
            head = await git(
                "symbolic-ref", "--quiet", "--short", "HEAD", cwd=clone, timeout_s=run, check=False
            )
            branch = text(head) if head.returncode == 0 else None
            commit = await commit_of("HEAD")
            if commit is None:
                raise ConfigError(
                    f"{without_credentials(options.repo_url)!r} has no commit at HEAD"
                )
            return commit, branch
        for name, branch in (
            (f"refs/heads/{ref}", ref),
            (f"refs/remotes/{options.remote_name}/{ref}", ref),
            (ref, None),
        ):
            commit = await commit_of(name)
            if commit is not None:
                return commit, branch
        raise ConfigError(
            f"ref {ref!r} is not a branch, tag or commit of "
            f"{without_credentials(options.repo_url)!r} (a pull request head needs fetch_refspecs)"
        )

    async def finalize(
        self, bound: BoundWorkspace, *, outcome: str | None = None
    ) -> WorkspaceSnapshot:
        """Record the bound commit and branch, whether the workspace is dirty, and the
        agent's changes as a bounded patch; then release the binding and its clone."""
        tree_id, state = await self._observe(bound)
        self._release(bound)
        return WorkspaceSnapshot(
            snapshot_id=tree_id, binding="git", source=bound.source, outcome=outcome, git=state
        )

    async def observe_revision(self, bound: BoundWorkspace) -> WorkspaceRevision:
        tree_id, state = await self._observe(bound)
        return WorkspaceRevision(
            supported=True, revision=tree_id, changed_paths=state.changed_paths, git=state
        )

    async def _observe(self, bound: BoundWorkspace) -> tuple[str, GitState]:
        session, state = self._state(bound)
        options = self.options
        run = options.timeout_s
        async with retrieved(session, state.path, options.limits()) as tree:
            await anyio.to_thread.run_sync(_drop_git_dirs, tree)
            scratch = tree.parent
            env = {
                "GIT_DIR": str(state.clone / ".git"),
                "GIT_WORK_TREE": str(tree),
                "GIT_INDEX_FILE": str(scratch / "index"),
            }

            async def isolated(*args: str) -> bytes:
                result = await git(*args, cwd=tree, mode="isolated", env=env, timeout_s=run)
                return result.stdout

            await isolated("read-tree", state.commit)
            await isolated("add", "--all", "--", ".")
            tree_id = (await isolated("write-tree")).decode().strip()
            names = await isolated(
                "diff", "--cached", "--name-only", "-z", "--no-renames", state.commit, "--"
            )
            changed = [n.decode("utf-8", errors="replace") for n in names.split(b"\0") if n]
            patch = scratch / "patch"
            with patch.open("wb") as out:
                await git(
                    "diff", "--cached", "--binary", "--no-textconv", "--no-ext-diff", "--no-color",
                    state.commit, "--",
                    cwd=tree, mode="isolated", env=env, timeout_s=run, stdout=out,
                )  # fmt: skip
            size = patch.stat().st_size
            with patch.open("rb") as src:
                diff = src.read(options.max_diff_bytes).decode("utf-8", errors="replace")
        return tree_id, GitState(
            commit=state.commit,
            branch=state.branch,
            dirty=bool(changed),
            changed_paths=tuple(changed[:MAX_CHANGED_PATHS]),
            changed_paths_truncated=len(changed) > MAX_CHANGED_PATHS,
            diff=diff,
            diff_truncated=size > options.max_diff_bytes,
        )

    def _discard(self, state: _Bind) -> None:
        shutil.rmtree(state.clone.parent, ignore_errors=True)


def _drop_git_dirs(tree: Path) -> None:
    """Every `.git` the sandbox returned goes unread: its config, hooks and refs are the
    agent's, and a git run on them would take the agent's word (or run its commands)."""
    for directory, dirnames, filenames in os.walk(tree):
        for name in (*dirnames, *filenames):
            if name == ".git":
                path = Path(directory) / name
                if path.is_dir() and not path.is_symlink():
                    remove_tree(path)
                else:
                    path.unlink()
        dirnames[:] = [d for d in dirnames if d != ".git"]
