"""One exec path: `EnvironmentSession.exec` is final, checks and normalizes its arguments
once into an `ExecRequest`, logs once, and calls the provider's `_exec(request)`."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from corral.core.session import EnvironmentSession, ExecRequest, ExecResult
from corral.errors import ConfigError
from corral.network.policy import NetworkPolicy
from tests.unit.fakes import FakeEnvironment, FakeSession

pytestmark = pytest.mark.anyio


def session(default_timeout: float | None = None) -> FakeSession:
    made = FakeSession(FakeEnvironment(), NetworkPolicy.public())
    made.default_timeout = default_timeout
    return made


def test_overriding_exec_is_refused_at_class_creation() -> None:
    with pytest.raises(TypeError, match=r"overrides exec\(\).*_exec\("):

        class Sneaky(FakeSession):  # pyright: ignore[reportUnusedClass]
            async def exec(self, command: Any, **_: Any) -> ExecResult:  # type: ignore[override]  # pyright: ignore[reportIncompatibleMethodOverride]
                raise AssertionError


def test_a_provider_must_implement_the_hook() -> None:
    class NoHook(EnvironmentSession):
        async def _upload(self, local: Any, remote: str, service: str | None) -> None: ...
        async def _download(
            self, remote: str, local: Any, service: str | None, max_bytes: int | None
        ) -> None: ...
        async def _upload_dir(
            self, local_dir: Any, remote_dir: str, service: str | None
        ) -> None: ...
        async def _download_dir(
            self, remote_dir: str, local_dir: Any, service: str | None
        ) -> None: ...

    with pytest.raises(TypeError, match="_exec"):
        NoHook(id="x", policy=NetworkPolicy.public())  # type: ignore[abstract]  # pyright: ignore[reportAbstractUsage]


async def test_the_hook_gets_one_normalized_request() -> None:
    sandbox = session(default_timeout=30)
    sandbox.output_limit = 1234

    def on_output(stream: str, text: str) -> None:
        del stream, text

    result = await sandbox.exec(
        "echo hi", cwd="sub", env={"A": "1"}, user="nobody", stdin="é", on_output=on_output
    )
    assert result.returncode == 0
    assert sandbox.requests == [
        ExecRequest(
            ("sh", "-c", "echo hi"),
            cwd="sub",
            env={"A": "1"},
            user="nobody",
            timeout=30.0,
            stdin="é".encode(),
            on_output=on_output,
            output_limit=1234,
        )
    ]


async def test_defaults_resolve_once() -> None:
    sandbox = session()
    await sandbox.exec(["true"], cwd="", timeout=5)
    await sandbox.exec(("ls", "-l"), stdin=b"x")
    first, second = sandbox.requests
    assert first == ExecRequest(("true",), timeout=5.0)
    assert second == ExecRequest(("ls", "-l"), stdin=b"x")


async def test_the_request_is_frozen_and_owns_its_env() -> None:
    env = {"A": "1"}
    sandbox = session()
    await sandbox.exec(["true"], env=env)
    env["B"] = "2"
    (request,) = sandbox.requests
    assert dict(request.env) == {"A": "1"}
    with pytest.raises(AttributeError):
        request.timeout = 1  # type: ignore[misc]  # pyright: ignore[reportAttributeAccessIssue]


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"command": []}, ValueError, "must be a string or a non-empty list of strings"),
        ({"command": ["ls", 3]}, ValueError, "must be a string or a non-empty list"),
        ({"command": ["ls", "a\0b"]}, ValueError, "NUL"),
        ({"command": ""}, ValueError, "command '' is empty"),
        ({"command": "  \n"}, ValueError, "is empty"),
        ({"command": [""]}, ValueError, r"command \[''\] names no program"),
        ({"command": "echo a\0b"}, ValueError, "NUL"),
        ({"cwd": "a\0b"}, ConfigError, r"exec cwd 'a\\x00b'"),
        ({"env": {"A=B": "x"}}, ConfigError, "environment variable name 'A=B' is not valid"),
        ({"env": {"": "x"}}, ConfigError, "environment variable name '' is not valid"),
        ({"env": {"TOKEN": 5}}, ConfigError, "'TOKEN' must have a string value"),
        ({"env": ["A=1"]}, ConfigError, "exec env must be a mapping"),
        ({"timeout": -1}, ConfigError, "exec timeout -1 must be a positive number"),
        ({"timeout": 0}, ConfigError, "exec timeout 0 must be a positive number"),
        ({"timeout": float("nan")}, ConfigError, "exec timeout nan"),
        ({"timeout": "5"}, ConfigError, "exec timeout '5'"),
        ({"timeout": True}, ConfigError, "exec timeout True"),
        ({"user": 0}, ConfigError, "exec user 0"),
        ({"stdin": 5}, ConfigError, "exec stdin must be str or bytes"),
        ({"on_output": "print"}, ConfigError, "exec on_output 'print' must be callable"),
    ],
)
async def test_bad_arguments_raise_naming_the_value(
    arguments: dict[str, Any], error: type[Exception], match: str
) -> None:
    sandbox = session()
    command = arguments.pop("command", ["true"])
    with pytest.raises(error, match=match):
        await sandbox.exec(command, **arguments)
    assert sandbox.requests == [], "a bad argument never reaches the provider"


async def test_an_env_value_is_never_shown() -> None:
    sandbox = session()
    with pytest.raises(ConfigError) as raised:
        await sandbox.exec(["true"], env={"TOKEN": "hunter2\0"})
    assert "hunter2" not in str(raised.value)
    assert "'TOKEN'" in str(raised.value)


async def test_logged_once_at_debug_without_env_values(caplog: pytest.LogCaptureFixture) -> None:
    sandbox = session()
    with caplog.at_level(logging.DEBUG, logger="corral.session"):
        await sandbox.exec(["true"], env={"TOKEN": "hunter2"})
    records = [r for r in caplog.records if r.name == "corral.session"]
    assert len(records) == 1
    (record,) = records
    assert record.levelno == logging.DEBUG
    assert "hunter2" not in record.getMessage()
    assert "hunter2" not in repr(record.__dict__)
    assert "TOKEN" in record.getMessage()
    fields: dict[str, Any] = record.__dict__["corral"]
    assert fields["sandbox"] == sandbox.id and fields["returncode"] == 0


async def test_a_failed_exec_is_logged_once_and_raised(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(FakeSession):
        async def _exec(self, request: ExecRequest) -> ExecResult:
            raise RuntimeError("transport gone")

    sandbox = Broken(FakeEnvironment(), NetworkPolicy.public())
    with (
        caplog.at_level(logging.DEBUG, logger="corral.session"),
        pytest.raises(RuntimeError, match="transport gone"),
    ):
        await sandbox.exec("true")
    records = [r for r in caplog.records if r.name == "corral.session"]
    assert len(records) == 1
    assert records[0].__dict__["corral"]["error"] == "RuntimeError"


def _bare(cls: type[EnvironmentSession], **attrs: Any) -> Any:
    """A provider session without its engine: only what `exec` and `_exec` read."""
    made = object.__new__(cls)
    EnvironmentSession.__init__(made, id="s", policy=NetworkPolicy.public())
    for name, value in attrs.items():
        setattr(made, name, value)
    return made


class Recorder:
    """A session's executor that only keeps the requests it is handed."""

    def __init__(self, seen: list[ExecRequest]) -> None:
        self.seen = seen

    async def run(self, request: ExecRequest) -> ExecResult:
        self.seen.append(request)
        return ExecResult(returncode=0, stdout="", stderr="", duration_s=0.0)


async def test_docker_resolves_cwd_and_user_then_hands_over_the_core_request() -> None:
    pytest.importorskip("docker")
    from corral.providers.docker.session import DockerSession

    seen: list[ExecRequest] = []

    sandbox = _bare(
        DockerSession,
        executor=Recorder(seen),
        sandbox="c1",
        workdir="/work",
        user="agent",
        default_timeout=9.0,
    )
    await sandbox.exec("pwd", cwd="sub/../x")
    await sandbox.exec(["id"], cwd="/abs", user="0", timeout=2)
    await sandbox.exec(["id"])
    assert seen == [
        ExecRequest(("sh", "-c", "pwd"), cwd="/work/x", user="agent", timeout=9.0),
        ExecRequest(("id",), cwd="/abs", user="0", timeout=2.0),
        ExecRequest(("id",), user="agent", timeout=9.0),
    ]


async def test_kubernetes_refuses_a_user_and_makes_cwd_absolute() -> None:
    pytest.importorskip("kubernetes")
    from corral.errors import ExecUserUnsupported
    from corral.providers.k8s import session as k8s

    seen: list[ExecRequest] = []

    sandbox = _bare(
        k8s.KubernetesSession,
        executor=Recorder(seen),
        target="pod",
        workdir="/w",
        output_limit=77,
        run_as=None,
    )
    with pytest.raises(ExecUserUnsupported, match="'root'"):
        await sandbox.exec(["id"], user="root")
    await sandbox.exec(["ls"], cwd="d", env={"A": "1"}, stdin="x")
    sandbox.run_as = 0  # a Pod whose spec runs it as root takes Harbor's user="root"
    await sandbox.exec(["id"], user="root")
    assert seen == [
        ExecRequest(("ls",), cwd="/w/d", env={"A": "1"}, stdin=b"x", output_limit=77),
        ExecRequest(("id",), output_limit=77),  # as the Pod runs: no user to look up
    ]
