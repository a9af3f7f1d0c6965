"""Host trees and git repositories the workspace tests build, and views of them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from corral.core.session import EnvironmentSession


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return root


def tree(root: Path) -> dict[str, str]:
    """Every file and link under `root` (links as `-> target`), by relative path."""
    found: dict[str, str] = {}
    for here, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(here) / name
            relative = path.relative_to(root).as_posix()
            found[relative] = f"-> {path.readlink()}" if path.is_symlink() else path.read_text()
    return found


def leftovers(source: Path) -> list[str]:
    """Staging directories a sync left beside `source`."""
    return sorted(p.name for p in source.parent.iterdir() if p.name.startswith(".corral"))


async def sh(sandbox: EnvironmentSession, script: str) -> str:
    result = await sandbox.exec(["sh", "-c", script])
    assert result.returncode == 0, result
    return result.stdout


def git(repo: Path, *args: str) -> str:
    result = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        check=True,
        capture_output=True,
        text=True,
    )
    return result.stdout.strip()


def commit(repo: Path, files: dict[str, str], message: str) -> str:
    write_tree(repo, files)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", message)
    return git(repo, "rev-parse", "HEAD")


def bare_repository(root: Path) -> tuple[Path, dict[str, str]]:
    """A bare repository with `main` (two commits), tag `v1` at the first, branch
    `feature`, and a pull request head at `refs/pull/7/head` that no branch contains.
    Returns it and the commits by name."""
    work = root / "work"
    work.mkdir(parents=True)
    git(work, "init", "-q", "-b", "main")
    commits = {"v1": commit(work, {"README": "one\n", "src/app.py": "print(1)\n"}, "one")}
    git(work, "tag", "v1")
    commits["main"] = commit(work, {"src/app.py": "print(2)\n"}, "two")
    git(work, "checkout", "-q", "-b", "feature")
    commits["feature"] = commit(work, {"FEATURE": "yes\n"}, "feature")
    git(work, "checkout", "-q", "-b", "pr", "main")
    commits["pr"] = commit(work, {"src/app.py": "print('pr')\n"}, "pull request")
    git(work, "checkout", "-q", "main")
    bare = root / "origin.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(bare)], check=True)
    git(bare, "update-ref", "refs/pull/7/head", commits["pr"])
    git(bare, "branch", "-D", "pr")
    return bare, commits
