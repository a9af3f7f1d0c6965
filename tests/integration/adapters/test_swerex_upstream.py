"""SWE-ReX's own runtime tests, run against `corral.adapters.swerex` on a real Docker
Engine.

The tests are SWE-ReX's, unchanged, read from the sdist of the version uv.lock pins (its
wheel has none): `bash tests/integration/adapters/swerex_sdist.sh` unpacks it (tests/run.sh
does) and checks it against the lock's hash; where it is missing these tests fail in CI
and skip elsewhere. Their fixtures are given here: `remote_runtime` (and
`local_runtime`) is the runtime of a `CorralDeployment` built by `get_deployment()` from a
`CorralDeploymentConfig` (one Docker sandbox for the module, every bash session closed
after each test), `runtime_with_default_session` that runtime with its `default` session,
and the `_Action`/`_Command` of their conftest (which the sdist leaves out): a 5-second
timeout unless given. Their image is Python's own; ours gets `python` (to python3), which
`test_bash_multiline_command_eof` calls.

What applies, and runs here (45 of the 52 tests that take a runtime):
- `tests/test_execution.py`: every test but the seven below (43): sessions, commands,
  exit codes and `check`, timeouts and interrupts, syntax errors, output, files, uploads.
- `tests/test_local_runtime.py`: `test_upload_file`, `test_upload_directory`.

What does not apply, and why:
- `test_execution.py::test_server_dead`: it tests SWE-ReX's HTTP client against a host
  that does not exist (a DNS query to the outside); there is no server here.
- `test_execution.py::test_read_write_file`: it checks the written file on the test's own
  filesystem (SWE-ReX's test server runs on the test host); ours lands in the sandbox.
- `test_execution.py::test_read_large_file`: the same, the other way (the file is written
  on the host and read through the runtime); `test_swerex.py` reads 1 MiB from the sandbox.
- `test_execution.py::test_run_in_shell_interactive_command`, `..._interactive_command_timeout`
  (and `test_run_in_shell_multiple_interactive_and_normal_commands`, which SWE-ReX itself
  marks xfail): they drive a REPL through the session's terminal; a corral shell gives each
  command a closed stdin (no terminal: a result's end never depends on a prompt), and the
  runtime refuses interactive actions (a program is driven through `session.start` with a
  pty instead).
- `test_execution.py::test_interrupt_pager`: it needs `less` to wait on a terminal and
  pexpect's Ctrl-Z fallback (`kill -9 %1` in the output); without a terminal `less` prints
  and exits. (The image has no `less` either.)
- `tests/test_runtime.py`: unit tests of `swerex.runtime.local`'s own parsing helpers (no
  runtime). Deployment tests (`test_docker_deployment.py`, `test_local_deployment.py`,
  `test_remote_deployment.py`, `test_dummy_deployment.py`, `test_get_deployment.py`,
  `test_modal_deployment.py`, `test_fargate_deployment.py`) and `test_server.py` construct
  SWE-ReX's own deployments or server by name; `test_swerex.py` checks ours the same way.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from collections.abc import AsyncIterator, Callable, Coroutine
from importlib.metadata import version
from pathlib import Path
from typing import Any, cast

import pytest
from swerex.runtime.abstract import (
    BashAction,
    CloseBashSessionRequest,
    Command,
    CreateBashSessionRequest,
)

from corral import ExecutionPlan
from corral.adapters.swerex import CorralDeployment, CorralDeploymentConfig, CorralRuntime
from tests.integration.adapters.inspect_configs import DOCKER
from tests.integration.conftest import unavailable
from tests.integration.docker.conftest import TEST_IMAGE

pytestmark = [pytest.mark.anyio, pytest.mark.docker]

SDIST = (
    Path(os.environ.get("CORRAL_SWEREX_TESTS") or Path.home() / ".cache" / "corral" / "swe-rex")
    / f"swe_rex-{version('swe-rex')}"
)

NOT_APPLICABLE = {
    "test_server_dead",
    "test_read_write_file",
    "test_read_large_file",
    "test_run_in_shell_interactive_command",
    "test_run_in_shell_interactive_command_timeout",
    "test_run_in_shell_multiple_interactive_and_normal_commands",
    "test_interrupt_pager",
}
#: SWE-ReX's test modules that take a runtime, and the tests of each that apply
#: (None: every test but those in NOT_APPLICABLE)
MODULES: dict[str, set[str] | None] = {
    "test_execution": None,
    "test_local_runtime": {"test_upload_file", "test_upload_directory"},
}
#: how many of their tests apply, so that a new SWE-ReX release is looked at, not skipped
APPLY_COUNT = 45


class _Action(BashAction):
    """Their conftest's action: a 5-second timeout unless the test gives one."""

    timeout: float | None = 5


class _Command(Command):
    """Their conftest's command: a 5-second timeout unless the test gives one."""

    timeout: float | None = 5


Test = Callable[..., Coroutine[Any, Any, None]]


def _upstream() -> dict[str, Test]:
    """Their applicable tests by the name they get here (`test_<module>__<name>`)."""
    package = "swerex_upstream_tests"
    root = types.ModuleType(package)
    root.__path__ = [str(SDIST / "tests")]
    conftest = types.ModuleType(f"{package}.conftest")
    conftest.__dict__.update(_Action=_Action, _Command=_Command)
    sys.modules.update({package: root, f"{package}.conftest": conftest})
    found: dict[str, Test] = {}
    for name, wanted in MODULES.items():
        spec = importlib.util.spec_from_file_location(
            f"{package}.{name}", SDIST / "tests" / f"{name}.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        for attribute, value in vars(module).items():
            if not attribute.startswith("test_") or not callable(value):
                continue
            if (wanted is None and attribute not in NOT_APPLICABLE) or (
                wanted is not None and attribute in wanted
            ):
                here = f"test_{name.removeprefix('test_')}__{attribute.removeprefix('test_')}"
                found[here] = cast(Test, value)
    return found


def _absent(reason: str) -> Test:
    async def test() -> None:
        unavailable(reason)

    return test


def _collected() -> dict[str, Test]:
    if not (SDIST / "tests" / "test_execution.py").is_file():
        reason = (
            f"SWE-ReX's tests are not unpacked at {SDIST}: run "
            "`bash tests/integration/adapters/swerex_sdist.sh`"
        )
        return {"test_swerex_upstream_tests": _absent(reason)}
    found = _upstream()
    assert len(found) == APPLY_COUNT, sorted(found)
    return found


globals().update(_collected())


@pytest.fixture(scope="module")
async def deployment(engine: Any, owner: str) -> AsyncIterator[CorralDeployment]:
    config = CorralDeploymentConfig(
        provider="docker",
        provider_config={**DOCKER, "owner": owner},
        plan=ExecutionPlan(image=TEST_IMAGE),
    )
    deployment = config.get_deployment()
    await deployment.start()
    try:
        python = ["ln", "-s", "/usr/bin/python3", "/usr/local/bin/python"]
        await deployment.runtime.execute(Command(command=python, check=True))
        yield deployment
    finally:
        await deployment.stop()


@pytest.fixture
async def remote_runtime(deployment: CorralDeployment) -> AsyncIterator[CorralRuntime]:
    try:
        yield deployment.runtime
    finally:
        await deployment.runtime.close()


@pytest.fixture
def local_runtime(remote_runtime: CorralRuntime) -> CorralRuntime:
    return remote_runtime


@pytest.fixture
async def runtime_with_default_session(
    remote_runtime: CorralRuntime,
) -> AsyncIterator[CorralRuntime]:
    await remote_runtime.create_session(CreateBashSessionRequest())
    try:
        yield remote_runtime
    finally:
        await remote_runtime.close_session(CloseBashSessionRequest())
