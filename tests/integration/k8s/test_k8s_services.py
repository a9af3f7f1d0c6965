"""Services on `k8s`: containers of the sandbox's Pod, so under its network namespace and
its NetworkPolicy. The sandbox and a `web` service reach each other on localhost, both
are refused what the policy refuses, a switch applies to both, and `service=` sends exec
and every file call into that container."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral import ConfigError, EnvironmentSession, ExecutionPlan, NetworkPolicy, ProviderError
from corral.errors import RemotePathNotFound
from corral.providers.k8s import KubernetesEnvironment
from corral.providers.k8s.session import KubernetesSession
from tests.integration.k8s.conftest import TEST_IMAGE, make_env
from tests.integration.k8s.test_k8s_end_workload import live_pids
from tests.integration.k8s.test_k8s_provider import objects

pytestmark = pytest.mark.anyio

SERVER_PORT = 9000  # plain_server's
WEB_PORT = 8080
# A GET on localhost, retried while the server comes up: prints the body.
FETCH = (
    "import sys, time, urllib.request\n"
    "for _ in range(50):\n"
    "    try:\n"
    "        print(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode(), end='')\n"
    "        break\n"
    "    except OSError:\n"
    "        time.sleep(0.1)\n"
    "else:\n"
    "    sys.exit(1)\n"
)
WEB: dict[str, Any] = {
    "image": TEST_IMAGE,
    "command": ["python3", "-m", "http.server", str(WEB_PORT), "--bind", "127.0.0.1"],
    "workdir": "/srv",
    "healthcheck": {"test": f"nc -z 127.0.0.1 {WEB_PORT}", "interval_s": 0.2, "retries": 50},
}


def plan(baseline: str = "no-network", **web: Any) -> ExecutionPlan:
    return ExecutionPlan.model_validate(
        {
            "image": TEST_IMAGE,
            "network": {"baseline": baseline},
            "services": {"web": {**WEB, **web}},
        }
    )


async def fetch(session: EnvironmentSession, url: str, service: str | None = None) -> str:
    result = await session.exec(["python3", "-c", FETCH, url], service=service, timeout=30)
    assert result.ok, f"{url} from {service or 'sandbox'}: {result.stderr}"
    return result.stdout


async def dials(session: EnvironmentSession, host: str, service: str | None) -> bool:
    result = await session.exec(["nc", "-z", "-w", "3", host, str(SERVER_PORT)], service=service)
    return result.returncode == 0


async def both_dial(session: EnvironmentSession, host: str) -> tuple[bool, bool]:
    return await dials(session, host, None), await dials(session, host, "web")


async def test_the_sandbox_and_a_service_share_localhost(cluster: Any, namespace: str) -> None:
    """Under no-network (loopback is the Pod's own): main fetches from `web`, `web` from a
    server main runs; then attach finds the service as open made it; close leaves nothing."""
    env = make_env(namespace, owner="svc-localhost")
    session = await env.open(plan())
    try:
        assert session.services == ("web",)
        await session.write_text("page.txt", "served by web\n", service="web")
        assert await fetch(session, f"http://127.0.0.1:{WEB_PORT}/page.txt") == "served by web\n"
        started = await session.exec(
            "mkdir -p /tmp/m && echo served by main > /tmp/m/hello && "
            "setsid nohup python3 -m http.server 7000 --bind 127.0.0.1 --directory /tmp/m "
            "</dev/null >/dev/null 2>&1 &"
        )
        assert started.ok, started.stderr
        assert await fetch(session, "http://127.0.0.1:7000/hello", "web") == "served by main\n"

        attached = await make_env(namespace, owner="svc-localhost").attach(session.id)
        assert attached.services == ("web",)
        assert (await attached.read_text("/srv/page.txt", service="web")) == "served by web\n"
    finally:
        await env.close(session)
    assert objects(cluster, namespace, "svc-localhost") == []


async def test_exec_and_file_calls_land_in_the_named_container(
    namespace: str, tmp_path: Path
) -> None:
    env = make_env(namespace, owner="svc-files")
    async with env.session(plan()) as session:
        # PID 1 tells the containers apart: corral's gate shell, or the service's server.
        main_init = await session.exec(["cat", "/proc/1/cmdline"])
        web_init = await session.exec(["cat", "/proc/1/cmdline"], service="web")
        assert main_init.stdout.split("\0")[:3] == ["/.corral/busybox", "sh", "-c"]
        assert web_init.stdout.split("\0")[:3] == ["python3", "-m", "http.server"]
        assert (await session.exec(["pwd"], service="web")).stdout == "/srv\n"
        assert (await session.exec(["pwd"], cwd="sub/..", service="web")).stdout == "/srv\n"

        await session.write_text("note.txt", "for web only", service="web")
        assert await session.read_text("/srv/note.txt", service="web") == "for web only"
        with pytest.raises(RemotePathNotFound):
            await session.read_text("/srv/note.txt")
        await session.write_text("/srv/note.txt", "for main only")
        assert await session.read_text("note.txt", service="web") == "for web only"

        tree = tmp_path / "tree"
        (tree / "sub").mkdir(parents=True)
        (tree / "a.txt").write_text("a")
        (tree / "sub" / "b.bin").write_bytes(bytes(range(256)) * 4096)
        await session.upload_dir(tree, "uploaded", service="web")
        listed = await session.exec(["find", "/srv/uploaded", "-type", "f"], service="web")
        assert sorted(listed.stdout.split()) == ["/srv/uploaded/a.txt", "/srv/uploaded/sub/b.bin"]
        absent = await session.exec(["test", "-e", "/srv/uploaded"])
        assert absent.returncode == 1, "the upload landed in the sandbox container too"
        back = tmp_path / "back"
        await session.download_dir("/srv/uploaded", back, service="web")
        assert (back / "a.txt").read_text() == "a"
        assert (back / "sub" / "b.bin").read_bytes() == (tree / "sub" / "b.bin").read_bytes()
        with pytest.raises(RemotePathNotFound):
            await session.download_dir("/srv/uploaded", tmp_path / "none")

        calls = {
            "exec": session.exec(["true"], service="nope"),
            "write_text": session.write_text("x", "x", service="nope"),
            "read_text": session.read_text("x", service="nope"),
            "upload_dir": session.upload_dir(tree, "x", service="nope"),
            "download_dir": session.download_dir("x", tmp_path / "x", service="nope"),
        }
        for call, awaitable in calls.items():
            with pytest.raises(ConfigError, match="no service 'nope'.*services: web"):
                await awaitable
            assert not (tmp_path / "x").exists(), call


async def test_the_policy_and_its_switches_cover_every_container(
    cluster: Any, namespace: str, plain_server: str
) -> None:
    """Toward a Pod of the test's own: refused to both under no-network, reached by both
    once an allowlist names it, refused to both again after switching back, reached by
    both under public."""
    env = make_env(namespace, owner="svc-policy")

    async def opened() -> tuple[bool, bool]:
        # What a switch newly allows opens when the CNI next syncs (a switch waits only
        # for what it forbids to be refused): closed meanwhile, so wait for it.
        for _ in range(60):
            if await dials(session, plain_server, None):
                break
            await anyio.sleep(0.5)
        return await both_dial(session, plain_server)

    async with env.session(plan("no-network")) as session:
        seen = [await both_dial(session, plain_server)]
        await session.set_network_policy(NetworkPolicy.allowlist(f"{plain_server}:{SERVER_PORT}"))
        seen.append(await opened())
        await session.set_network_policy(NetworkPolicy.no_network())
        seen.append(await both_dial(session, plain_server))
        await session.set_network_policy(NetworkPolicy.public())
        seen.append(await opened())
    assert seen == [(False, False), (True, True), (False, False), (True, True)]
    assert objects(cluster, namespace, "svc-policy") == []


async def test_a_failing_service_fails_open_naming_it_and_leaves_nothing(
    cluster: Any, namespace: str
) -> None:
    token = f"tok-{secrets.token_hex(8)}"
    env = make_env(namespace, owner="svc-unhealthy")
    failing = {
        "test": 'echo "not ready, token $API_TOKEN"; exit 3',
        "interval_s": 0.2,
        "retries": 3,
    }
    with pytest.raises(ProviderError, match="service 'web' did not become healthy") as raised:
        await env.open(plan(env={"API_TOKEN": token}, healthcheck=failing))
    assert "exited 3" in str(raised.value) and token not in str(raised.value)
    assert objects(cluster, namespace, "svc-unhealthy") == []

    with pytest.raises(ConfigError, match="service 'web'.*no-such/service:1"):
        await env.open(plan(image="no-such/service:1"))
    assert objects(cluster, namespace, "svc-unhealthy") == []

    with pytest.raises(ConfigError, match="service 'web'.*exited with code 7"):
        await env.open(plan(command=["sh", "-c", "exit 7"], healthcheck=None))
    assert objects(cluster, namespace, "svc-unhealthy") == []

    # An image without `sh`, which exec needs on Kubernetes: said, naming the service.
    unlink = "import os, time; os.unlink('/usr/bin/sh'); time.sleep(600)"
    check = {"test": ["true"], "interval_s": 0.2, "retries": 2}
    with pytest.raises(ProviderError, match="service 'web'.*`sh` and `env`"):
        await env.open(plan(command=["python3", "-c", unlink], healthcheck=check))
    assert objects(cluster, namespace, "svc-unhealthy") == []


async def test_end_workload_ends_the_sandbox_processes_and_leaves_services_running(
    namespace: str,
) -> None:
    env: KubernetesEnvironment = make_env(namespace, owner="svc-end")
    async with env.session(plan()) as session:
        assert isinstance(session, KubernetesSession)
        started = await session.exec("setsid nohup sleep 600 </dev/null >/dev/null 2>&1 &")
        assert started.ok, started.stderr
        await anyio.sleep(0.2)
        assert len(await live_pids(session)) > 1
        await session.end_workload()
        assert await live_pids(session) == {1}
        await session.write_text("alive.txt", "still serving\n", service="web")
        assert await fetch(session, f"http://127.0.0.1:{WEB_PORT}/alive.txt") == "still serving\n"


async def test_save_holds_the_sandbox_and_a_fork_starts_services_afresh(
    cluster: Any, namespace: str, tmp_path: Path
) -> None:
    env = make_env(namespace, owner="svc-fork", snapshot_dir=str(tmp_path / "store"))
    with_workdir = plan().model_copy(update={"workdir": "/work"})
    async with env.session(with_workdir) as parent:
        await parent.write_text("kept.txt", "in the sandbox")
        await parent.write_text("lost.txt", "in web", service="web")
        ref = await parent.save()
    child = await env.fork(ref, with_workdir)
    try:
        assert child.services == ("web",)
        assert await child.read_text("/work/kept.txt") == "in the sandbox"
        with pytest.raises(RemotePathNotFound):
            await child.read_text("/srv/lost.txt", service="web")
        await child.write_text("new.txt", "served\n", service="web")
        assert await fetch(child, f"http://127.0.0.1:{WEB_PORT}/new.txt") == "served\n"
    finally:
        await env.close(child)
    assert objects(cluster, namespace, "svc-fork") == []
