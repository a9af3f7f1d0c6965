"""The file calls are final on EnvironmentSession, as `exec` is: each checks its paths and
its service once, in one place, and a provider implements only `_upload` and the rest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from corral import ConfigError, NetworkPolicy
from tests.unit.fakes import FakeEnvironment, FakeSession

pytestmark = pytest.mark.anyio


class Recording(FakeSession):
    def __init__(self) -> None:
        super().__init__(FakeEnvironment(), NetworkPolicy.public())
        self.calls: list[tuple[Any, ...]] = []

    async def _upload(self, local: Path, remote: str, service: str | None) -> None:
        self.calls.append(("upload", local, remote, service))

    async def _download(
        self, remote: str, local: Path, service: str | None, max_bytes: int | None
    ) -> None:
        self.calls.append(("download", remote, local, service, max_bytes))


@pytest.mark.parametrize("name", ["upload", "download", "upload_dir", "download_dir"])
def test_overriding_a_file_call_is_refused_at_class_creation(name: str) -> None:
    async def override(self: object, *args: Any, **kwargs: Any) -> None:
        raise AssertionError

    with pytest.raises(TypeError, match=rf"overrides {name}\(\).*_{name}\("):
        type("Sneaky", (FakeSession,), {name: override})


async def test_the_provider_gets_checked_paths_and_service() -> None:
    session = Recording()
    await session.upload("a.txt", "/work/a.txt")
    await session.download("/work/a.txt", Path("b.txt"), max_bytes=10)
    assert session.calls == [
        ("upload", Path("a.txt"), "/work/a.txt", None),
        ("download", "/work/a.txt", Path("b.txt"), None, 10),
    ]


@pytest.mark.parametrize("remote", ["", "a\0b", None, 7])
async def test_a_bad_sandbox_path_is_refused_naming_it(remote: Any) -> None:
    session = Recording()
    with pytest.raises(
        ConfigError, match="sandbox path must be .*" + repr(remote).replace("\\", "\\\\")
    ):
        await session.upload("a.txt", remote)
    assert session.calls == [], "nothing reached the provider"


async def test_a_bad_local_path_service_or_limit_is_refused_before_the_provider() -> None:
    session = Recording()
    with pytest.raises(ConfigError, match="local path must be .*''"):
        await session.download("/a", "")
    with pytest.raises(ConfigError, match="max_bytes must be .*-1"):
        await session.download("/a", "b", max_bytes=-1)
    with pytest.raises(ConfigError, match="no service 'db'"):
        await session.upload("a", "/a", service="db")
    assert session.calls == []
