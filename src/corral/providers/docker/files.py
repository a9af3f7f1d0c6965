"""The file calls of a `docker` session: tar archives through the engine's archive API,
into or out of the container a call names (the sandbox or one of its services).

An upload lands where `landing` resolves its directory to, through the engine's view of
the container's files; a download's size is the engine's own tar header.
"""

from __future__ import annotations

import posixpath
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from docker.errors import APIError, NotFound

from corral.core.tarsafe import extract_file, extract_tar, pack_dir, pack_file, validate_dir
from corral.errors import ProviderError, RemotePathNotFound
from corral.providers.docker.engine import Engine
from corral.providers.docker.landing import SandboxFiles


@dataclass(frozen=True)
class Container:
    """Where a call lands: the sandbox container or a service's, and its working dir."""

    id: str
    workdir: str
    service: str | None = None

    def where(self) -> str:
        return "the sandbox" if self.service is None else f"service {self.service!r}"

    def absolute(self, path: str) -> str:
        return posixpath.normpath(posixpath.join(self.workdir, path))


#: makes a directory (and its parents) in a container, as the session does it
MakeDir = Callable[[str, Container], Awaitable[None]]


class ContainerFiles:
    """Uploads and downloads through `engine`, each sandbox path taken from the target's
    working directory; `mkdir` makes a missing upload directory."""

    def __init__(self, engine: Engine, mkdir: MakeDir) -> None:
        self.engine = engine
        self.mkdir = mkdir

    async def upload(self, local: Path, target: Container, remote: str) -> None:
        parent, name = posixpath.split(target.absolute(remote))
        await self._put(target, await self._landing(target, parent), pack_file(local, name))

    async def download(
        self, target: Container, remote: str, local: Path, max_bytes: int | None
    ) -> None:
        stream = await self._get(target, target.absolute(remote))
        try:
            # The size is the engine's tar header: the engine stats the file itself.
            await self.engine.call(extract_file, stream, local, remote, max_bytes)
        finally:
            # The engine holds the container's lock until the archive is read or closed:
            # left open (a refused or failed extraction), every later call hangs.
            stream.close()

    async def upload_dir(self, local_dir: Path, target: Container, remote_dir: str) -> None:
        directory = target.absolute(remote_dir)
        await self.engine.call(validate_dir, local_dir)
        await self._put(target, await self._landing(target, directory), pack_dir(local_dir))

    async def download_dir(self, target: Container, remote_dir: str, local_dir: Path) -> None:
        source = target.absolute(remote_dir)
        stream = await self._get(target, source)
        name = posixpath.basename(source.rstrip("/")) or "."
        try:
            await self.engine.call(lambda: extract_tar(stream, local_dir, strip=name))
        finally:
            stream.close()

    async def _landing(self, target: Container, path: str) -> str:
        """The real directory an upload to `path` lands in (see `landing`), created if missing."""
        files = SandboxFiles(self.engine, target.id)
        resolved = await files.resolve(path)
        if resolved is None:
            await self.mkdir(path, target)  # the container's mkdir: checked again after
            resolved = await files.resolve(path)
        if resolved is None:
            raise ProviderError(f"path {path!r} in {target.where()} vanished while it was created")
        return resolved

    async def _put(self, target: Container, directory: str, chunks: Any) -> None:
        try:
            await self.engine.call(self.engine.api.put_archive, target.id, directory, chunks)
        except NotFound:
            raise RemotePathNotFound(directory) from None
        except APIError as exc:
            raise ProviderError(
                f"upload to {directory!r} in {target.where()} failed: {exc.explanation}"
            ) from None

    async def _get(self, target: Container, path: str) -> Any:
        try:
            stream, _ = await self.engine.call(self.engine.api.get_archive, target.id, path)
        except NotFound:
            raise RemotePathNotFound(path) from None
        except APIError as exc:
            raise ProviderError(
                f"download of {path!r} from {target.where()} failed: {exc.explanation}"
            ) from None
        return stream
