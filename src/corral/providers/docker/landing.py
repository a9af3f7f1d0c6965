"""Where an upload into a sandbox lands, decided from the engine's view of its files.

The engine extracts an upload into the directory it is given after following every
symlink on the way there (inside the container's root). A link the workload planted on
that way sends the harness's files wherever it points: over root's files from a
non-root sandbox, or out of the directory the harness named. So the way is resolved
here, through the engine and never through the sandbox's own tools: directories, and
symlinks that came with the image (`/bin -> usr/bin`), are followed; a symlink the
workload made or changed is refused. The engine is then given a path with no symlink
left on it. Members of the upload replace whatever is at their own place (the engine
unlinks it first), so nothing below that directory can redirect them.

A workload process that runs during the upload could still swap a component between
this check and the write; the engine's chroot keeps such a write inside the container.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from docker.errors import APIError, NotFound

from corral.errors import ProviderError, UnsafeArchiveMember
from corral.providers.docker.engine import Engine

# Go's os.FileMode bits, in which the engine reports the mode of a path.
_MODE_SYMLINK = 1 << 27
_MODE_DIR = 1 << 31
_MAX_LINKS = 40  # as the kernel's limit on symlinks in one lookup
_LINK_ARCHIVE_BYTES = 64 * 1024
# Filesystems the engine keeps no diff of, where it cannot tell who made a link.
_KERNEL_MOUNTS = ("/dev", "/proc", "/sys")


@dataclass(frozen=True)
class SandboxFiles:
    """The engine's view of one container's files."""

    engine: Engine
    container: str

    async def resolve(self, path: str) -> str | None:
        """`path` through directories and image symlinks only; None if a part is missing."""
        resolved, pending, links = "/", list(PurePosixPath(path).parts[1:]), 0
        while pending:
            part = pending.pop(0)
            if part == "..":
                resolved = posixpath.dirname(resolved)
                continue
            current = posixpath.join(resolved, part)
            found = await self.lstat(current)
            if found is None:
                return None
            if found["mode"] & _MODE_SYMLINK:
                links += 1
                if links > _MAX_LINKS or not await self.from_image(current):
                    raise UnsafeArchiveMember(
                        f"sandbox path {current!r} is a symlink the workload made (to "
                        f"{found['linkTarget']!r}); refusing to upload to {path!r} through it"
                    )
                target = await self.link_target(current)
                resolved = "/" if target.startswith("/") else resolved
                pending[:0] = [p for p in target.split("/") if p not in ("", ".")]
                continue
            if not found["mode"] & _MODE_DIR:
                raise NotADirectoryError(f"sandbox path {current!r} is not a directory")
            resolved = current
        return resolved

    async def lstat(self, path: str) -> dict[str, Any] | None:
        """The engine's stat of `path`, its last component not followed; None if missing."""

        try:
            return await self.engine.call(self.engine.path_stat, self.container, path)
        except APIError as exc:
            raise ProviderError(f"cannot inspect {path!r}: {exc.explanation}") from None

    async def from_image(self, path: str) -> bool:
        """Whether `path` is as the image made it: not in the container layer's diff, and
        not on a mount, which the diff does not cover."""
        info: dict[str, Any] = await self.engine.call(
            self.engine.api.inspect_container, self.container
        )
        binds: list[dict[str, Any]] = info.get("Mounts") or []
        tmpfs: dict[str, str] = info["HostConfig"].get("Tmpfs") or {}
        mounts: list[str] = [m["Destination"] for m in binds] + list(tmpfs)
        if any(_under(path, mount) for mount in [*mounts, *_KERNEL_MOUNTS]):
            return False
        changes: list[dict[str, Any]] = await self.engine.call(self.engine.api.diff, self.container)
        return all(change["Path"] != path for change in changes or [])

    async def link_target(self, path: str) -> str:
        """What the symlink at `path` holds, read from the engine's archive of it."""
        try:
            stream, _ = await self.engine.call(self.engine.api.get_archive, self.container, path)
        except (NotFound, APIError) as exc:
            raise ProviderError(f"cannot read the link {path!r}: {exc}") from None

        def read() -> bytes:
            data = bytearray()
            for chunk in stream:
                data += chunk
                if len(data) > _LINK_ARCHIVE_BYTES:
                    break
            return bytes(data)

        try:
            data = await self.engine.call(read)
        finally:
            stream.close()
        try:
            with tarfile.open(fileobj=io.BytesIO(data)) as archive:
                member = archive.next()
        except tarfile.TarError:
            member = None
        if member is None or not member.issym():
            raise UnsafeArchiveMember(f"sandbox path {path!r} changed while it was checked")
        return member.linkname


def _under(path: str, mount: str) -> bool:
    return path == mount or path.startswith(mount.rstrip("/") + "/")
