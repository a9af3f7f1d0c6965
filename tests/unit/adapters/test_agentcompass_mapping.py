"""The AgentCompass adapter's mapping, on a labelled stand-in of AgentCompass's contract.

The provider is corral's `local` (embedded, no daemon); the real AgentCompass package is
exercised on Docker by tests/integration/adapters/test_agentcompass_docker.py.
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import corral.adapters.agentcompass as adapter
from corral import ExecResult
from corral.adapters.agentcompass.environment import define
from corral.adapters.agentcompass.mapping import (
    corral_command,
    corral_policy,
    corral_resources,
    exec_fields,
)
from corral.adapters.agentcompass.registration import register
from corral.network import NetworkMode
from corral.providers.local.session import LocalSession
from tests.unit.adapters.agentcompass_standin import NetworkPolicy, contract

pytestmark = pytest.mark.anyio


def test_registration_follows_whether_agentcompass_is_installed() -> None:
    # tests/run.sh runs the unit tests on 3.11 (without it) and on 3.12 (with it).
    if find_spec("agentcompass") is None:
        assert adapter.REGISTERED == []
        assert adapter.UNAVAILABLE is not None and "3.12" in adapter.UNAVAILABLE
    else:
        assert adapter.REGISTERED == ["corral-docker", "corral-k8s"]
        assert adapter.UNAVAILABLE is None


def test_policies_keep_their_field_names() -> None:
    policy = NetworkPolicy("allowlist", ["api.example.com", {"host": "10.0.0.0/8", "port": 443}])
    converted = corral_policy(policy)
    assert converted.network_mode is NetworkMode.ALLOWLIST
    assert [str(t) for t in converted.allowed_hosts] == ["api.example.com", "10.0.0.0/8:443"]
    assert corral_policy(NetworkPolicy("no-network")).network_mode is NetworkMode.NO_NETWORK


def test_resources_rename_storage_and_gpu_and_refuse_gpu_type() -> None:
    resources = corral_resources({"cpu": 2, "memory_mb": 512, "storage_mb": 1024, "gpu": 1})
    assert (resources.cpu, resources.memory_mb, resources.disk_mb, resources.gpus) == (
        2,
        512,
        1024,
        1,
    )
    with pytest.raises(ValueError, match="gpu_type"):
        corral_resources({"gpu": 1, "gpu_type": "h100"})


def test_commands_shell_and_detach() -> None:
    assert corral_command(["ls", "-l"], detach=False) == ["ls", "-l"]
    assert corral_command("echo $HOME", detach=False) == ["/bin/sh", "-c", "echo $HOME"]
    detached = corral_command(["sleep", "9"], detach=True)
    assert detached[:2] == ["/bin/sh", "-c"] and detached[-2:] == ["sleep", "9"]


def test_a_timed_out_result_reports_124() -> None:
    result = ExecResult(returncode=None, stdout="part", stderr="", timed_out=True, duration_s=1)
    assert exec_fields(result) == {
        "returncode": 124,
        "stdout": "part",
        "stderr": "",
        "timed_out": True,
    }


def test_register_offers_installed_providers_with_their_capabilities() -> None:
    ac = contract()
    assert "corral-docker" in register(ac)
    docker: Any = ac.ENVIRONMENTS.entries["corral-docker"]
    assert docker.supports_dynamic_network_policy
    assert {m.value for m in docker.supported_network_modes} == {
        "public",
        "no-network",
        "allowlist",
        "denylist",
    }


async def test_open_exec_files_close_on_local(tmp_path: Any) -> None:
    env, session = await _open_local(tmp_path)
    inner = session.inner
    assert isinstance(inner, LocalSession)
    workdir = inner.workspace / str(tmp_path).lstrip("/")  # local keeps paths in its root
    result = await session.exec(["sh", "-c", "pwd; echo $X"], env={"X": "y"})
    assert (result.returncode, result.stdout) == (0, f"{workdir}\ny\n")
    assert (await session.exec("exit 3", shell=True)).returncode == 3
    with pytest.raises(ValueError, match="flags"):
        await session.exec(["true"], flags={"tty": True})
    await session.write_text("a/b.txt", "text")
    assert (workdir / "a" / "b.txt").read_text() == "text"
    assert await session.close()
    assert inner.closed
    with pytest.raises(RuntimeError, match="corral gc"):
        await env.close(session_id=inner.id)


async def test_every_switch_after_the_run_ends_the_phase(tmp_path: Any) -> None:
    _, session = await _open_local(tmp_path)
    try:
        await session.set_network_policy("public")  # baseline -> run: the agent's phase
        started = await session.exec(
            "setsid sleep 300 >/dev/null 2>&1 & sleep 0.5; echo $!", shell=True
        )
        pid = int(started.stdout)
        assert _running(pid)
        await session.set_network_policy("public")  # run -> evaluation
        assert not _running(pid), "a run-phase process lives into evaluation"
    finally:
        assert await session.close()


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for its parent."""
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"


async def _open_local(workdir: Path) -> tuple[Any, Any]:
    """A `corral-local` AgentCompass environment and a session of it in `workdir`."""
    env: Any = define(contract(), "local")()
    environment = SimpleNamespace(params={}, setup={"workdir": str(workdir)})
    plan = SimpleNamespace(
        environment=SimpleNamespace(**vars(environment), baseline_network_policy="public"),
        run_network_policy=None,
        evaluation_network_policy=None,
        task_id="t1",
    )
    return env, await env.open(SimpleNamespace(benchmark=SimpleNamespace(id="b")), plan)
