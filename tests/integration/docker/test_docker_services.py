"""Services on a real engine: containers in the holder's network namespace, under the
sandbox's policy, reached by `service=`, removed with the session."""

from __future__ import annotations

import logging
import secrets
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import SecretStr

from corral import ConfigError, EnvironmentSession, ExecutionPlan, NetworkPolicy, ProviderError
from corral.core.plan import Healthcheck, ServiceSpec, Timeouts
from corral.errors import FeatureUnsupported, UnsafeArchiveMember
from corral.providers.docker import DockerEnvironment
from corral.providers.docker.pool import collect_idle
from corral.testing.plugin import EgressTarget
from tests.integration.docker.conftest import TEST_IMAGE, containers, leftovers, make_env

pytestmark = pytest.mark.anyio

SECRET = f"s3cret-{secrets.token_hex(8)}"
WEB_PORT = 8080
DB_PORT = 5432
MAIN_PORT = 7000

#: A TCP server answering every connection with `<name>-ok`, on loopback only.
SERVER = (
    "import socket,sys\n"
    "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
    "s.bind(('127.0.0.1',int(sys.argv[1])));s.listen()\n"
    "while True:\n"
    " c,_=s.accept();c.sendall(sys.argv[2].encode()+b'-ok\\n');c.close()\n"
)
#: Connects to 127.0.0.1:<port> (retrying while nothing listens) and prints what it reads.
CLIENT = (
    "import socket,sys,time\n"
    "end=time.time()+15\n"
    "while True:\n"
    " try:\n"
    "  c=socket.create_connection(('127.0.0.1',int(sys.argv[1])),2);break\n"
    " except OSError:\n"
    "  if time.time()>end: raise\n"
    "  time.sleep(0.1)\n"
    "print(c.recv(64).decode().strip())\n"
)


def listening(port: int) -> Healthcheck:
    return Healthcheck(test=["nc", "-z", "127.0.0.1", str(port)], interval_s=0.2, retries=100)


WEB = ServiceSpec(
    image=TEST_IMAGE,
    command=["python3", "-m", "http.server", str(WEB_PORT), "--bind", "127.0.0.1"],
    env={"WEB_TOKEN": SECRET, "GREETING": "hello-from-web"},
    healthcheck=listening(WEB_PORT),
    workdir="/srv/web",
)
DB = ServiceSpec(
    image=TEST_IMAGE,
    command=["python3", "-c", SERVER, str(DB_PORT), "db"],
    healthcheck=listening(DB_PORT),
)


def plan(policy: str = "no-network", **services: ServiceSpec) -> ExecutionPlan:
    return ExecutionPlan.model_validate(
        {
            "image": TEST_IMAGE,
            "network": {"baseline": policy},
            "services": services or {"web": WEB, "db": DB},
        }
    )


async def reads(session: EnvironmentSession, port: int, service: str | None = None) -> str:
    result = await session.exec(["python3", "-c", CLIENT, str(port)], service=service)
    return result.stdout.strip() if result.ok else f"failed: {result.stderr.strip()[-200:]}"


async def tcp(session: EnvironmentSession, target: EgressTarget, service: str | None) -> bool:
    result = await session.exec(
        ["nc", "-z", "-w", "3", target.host, str(target.port)], service=service
    )
    return result.returncode == 0


async def reach(session: EnvironmentSession, targets: list[EgressTarget]) -> dict[str, Any]:
    """Which targets the sandbox and the web service each reach."""
    return {
        who or "main": tuple([await tcp(session, t, who) for t in targets]) for who in (None, "web")
    }


def service_names(engine: Any, owner: str) -> list[str]:
    return sorted(name for name in containers(engine, owner) if "-svc-" in name)


async def test_services_and_sandbox_reach_each_other_on_localhost(
    engine: Any, owner: str, docker_env: DockerEnvironment
) -> None:
    async with docker_env.session(plan()) as session:
        assert session.services == ("web", "db")
        assert service_names(engine, owner) == [
            f"corral-{session.id}-svc-db",
            f"corral-{session.id}-svc-web",
        ]
        labels = containers(engine, owner)[f"corral-{session.id}-svc-web"]
        assert labels["corral.service"] == "web" and labels["corral.role"] == "service"
        # main -> web (HTTP, under no-network: loopback is never the policy's business)
        await session.write_text("/srv/web/hello.txt", "served by web\n", service="web")
        fetch = "import urllib.request as u;print(u.urlopen('http://127.0.0.1:8080/hello.txt').read().decode())"
        got = await session.exec(["python3", "-c", fetch])
        assert got.ok and got.stdout.strip() == "served by web", got
        # main -> db, web -> db
        assert await reads(session, DB_PORT) == "db-ok"
        assert await reads(session, DB_PORT, "web") == "db-ok"
        # web -> a server the main sandbox runs
        async with anyio.create_task_group() as group:
            group.start_soon(
                session.exec,
                ["python3", "-c", SERVER.replace("while True", "for _ in [0]"), "7000", "main"],
            )
            assert await reads(session, MAIN_PORT, "web") == "main-ok"
        # web's own processes are its own: the main sandbox does not run http.server
        mains = await session.exec(["ps", "-eo", "args"])
        webs = await session.exec(["ps", "-eo", "args"], service="web")
        assert "http.server" not in mains.stdout and "http.server" in webs.stdout
    assert service_names(engine, owner) == []
    assert leftovers(engine, owner) == []


async def test_the_policy_and_each_switch_cover_the_services(
    docker_env: DockerEnvironment, tcp_targets: list[EgressTarget]
) -> None:
    allowed, denied = tcp_targets
    seen: dict[str, dict[str, Any]] = {}
    async with docker_env.session(plan("no-network")) as session:
        seen["no-network"] = await reach(session, tcp_targets)
        await session.set_network_policy(NetworkPolicy.allowlist(allowed.host))
        seen["allowlist"] = await reach(session, tcp_targets)
        await session.set_network_policy(NetworkPolicy.public())
        seen["public"] = await reach(session, tcp_targets)
        await session.set_network_policy(NetworkPolicy.denylist(denied.host))
        seen["denylist"] = await reach(session, tcp_targets)
        await session.set_network_policy(NetworkPolicy.no_network())
        seen["no-network again"] = await reach(session, tcp_targets)
        # Loopback between them holds under every policy.
        assert await reads(session, DB_PORT, "web") == "db-ok"
    expected = {
        "no-network": (False, False),
        "allowlist": (True, False),
        "public": (True, True),
        "denylist": (True, False),
        "no-network again": (False, False),
    }
    assert seen == {mode: {"main": pair, "web": pair} for mode, pair in expected.items()}


async def test_a_public_baseline_lets_both_out(
    docker_env: DockerEnvironment, tcp_targets: list[EgressTarget]
) -> None:
    async with docker_env.session(plan("public", web=WEB)) as session:
        assert await reach(session, tcp_targets) == {"main": (True, True), "web": (True, True)}


async def test_exec_and_files_with_service_land_in_that_container(
    docker_env: DockerEnvironment, tmp_path: Path
) -> None:
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.txt").write_text("a\n")
    (tree / "sub" / "b.txt").write_text("b\n")
    async with docker_env.session(plan(web=WEB)) as session:
        where = await session.exec(["pwd"], service="web")
        env = await session.exec(["sh", "-c", 'echo "$GREETING"'], service="web")
        assert (where.stdout.strip(), env.stdout.strip()) == ("/srv/web", "hello-from-web")
        await session.write_text("notes/n.txt", "web note", service="web")
        assert await session.read_text("/srv/web/notes/n.txt", service="web") == "web note"
        await session.upload_dir(tree, "/srv/web/tree", service="web")
        listed = await session.exec(["find", "/srv/web/tree", "-type", "f"], service="web")
        assert sorted(listed.stdout.split()) == ["/srv/web/tree/a.txt", "/srv/web/tree/sub/b.txt"]
        relative = await session.exec(["pwd"], cwd="tree/sub", service="web")
        assert relative.stdout.strip() == "/srv/web/tree/sub"
        # Nothing of it in the main sandbox.
        absent = await session.exec(["ls", "/srv/web"])
        assert absent.returncode != 0
        back = tmp_path / "back"
        await session.download_dir("/srv/web/tree", back, service="web")
        assert (back / "sub" / "b.txt").read_text() == "b\n"
        assert (back / "a.txt").read_text() == "a\n"
        local = tmp_path / "one.txt"
        await session.download("/srv/web/notes/n.txt", local, service="web")
        assert local.read_text() == "web note"
        calls = {
            "exec": lambda: session.exec(["true"], service="nope"),
            "write_text": lambda: session.write_text("/x", "x", service="nope"),
            "read_text": lambda: session.read_text("/x", service="nope"),
            "upload_dir": lambda: session.upload_dir(tree, "/x", service="nope"),
            "download_dir": lambda: session.download_dir("/x", back, service="nope"),
        }
        for call in calls.values():
            with pytest.raises(ConfigError, match="'nope'.*services: web"):
                await call()
        # A link planted in the service is refused as one planted in the sandbox is.
        await session.exec(["ln", "-s", "/etc", "/srv/web/evil"], service="web")
        with pytest.raises(UnsafeArchiveMember, match="/srv/web/evil"):
            await session.write_text("/srv/web/evil/passwd", "x", service="web")
        # The main sandbox still answers as itself.
        assert (await session.exec(["pwd"])).stdout.strip() == "/"


async def test_secrets_of_a_service_stay_out_of_logs_reprs_and_errors(
    engine: Any, owner: str, docker_env: DockerEnvironment, caplog: pytest.LogCaptureFixture
) -> None:
    leaky = ServiceSpec(
        image=TEST_IMAGE,
        command=["sleep", "600"],
        env={"DB_PASSWORD": SecretStr(SECRET)},
        # Prints its secret, then fails: the error quotes the output, masked.
        healthcheck=Healthcheck(test='echo "pw=$DB_PASSWORD"; exit 3', interval_s=0.1, retries=2),
    )
    with caplog.at_level(logging.DEBUG, logger="corral"):
        async with docker_env.session(plan(web=WEB)) as session:
            seen = await session.exec(["sh", "-c", 'echo "$WEB_TOKEN"'], service="web")
            assert seen.stdout.strip() == SECRET, "the service gets its env"
            assert SECRET not in repr(session) and SECRET not in repr(plan(web=WEB))
        with pytest.raises(ProviderError, match="service 'leaky'") as caught:
            await docker_env.open(plan(leaky=leaky))
    assert "pw=***" in str(caught.value) and SECRET not in str(caught.value)
    assert SECRET not in caplog.text
    assert leftovers(engine, owner) == []


async def test_a_failing_healthcheck_fails_open_naming_the_service(
    engine: Any, owner: str, docker_env: DockerEnvironment
) -> None:
    sick = ServiceSpec(
        image=TEST_IMAGE,
        command=["sleep", "600"],
        healthcheck=Healthcheck(test=["nc", "-z", "127.0.0.1", "9"], interval_s=0.1, retries=3),
    )
    started = time.monotonic()
    with pytest.raises(ProviderError, match="service 'sick' did not become healthy"):
        await docker_env.open(plan(web=WEB, sick=sick))
    assert time.monotonic() - started < 30
    assert leftovers(engine, owner) == []


async def test_a_service_that_exits_at_once_is_named_with_its_output(
    engine: Any, owner: str, docker_env: DockerEnvironment
) -> None:
    # The engine reports a container as running for a moment after `start`, so a service
    # that exits within milliseconds may pass the first look; it exits within a second
    # here, while another service's healthcheck holds the open for longer, so the last
    # look (every service must still run when open() returns) sees it gone.
    dying = ServiceSpec(
        image=TEST_IMAGE, command=["sh", "-c", "sleep 0.5; echo boom-$$ >&2; exit 7"]
    )
    slow = ServiceSpec(
        image=TEST_IMAGE,
        command=["sleep", "600"],
        healthcheck=Healthcheck(test=["true"], start_period_s=3),
    )
    with pytest.raises(ProviderError, match=r"service 'dying'.*exited \(code 7\).*boom-"):
        await docker_env.open(plan(dying=dying, slow=slow))
    assert leftovers(engine, owner) == []


async def test_a_startup_timeout_while_services_start_leaves_nothing(
    engine: Any, owner: str, docker_env: DockerEnvironment
) -> None:
    never = ServiceSpec(
        image=TEST_IMAGE,
        command=["sleep", "600"],
        healthcheck=Healthcheck(test=["false"], interval_s=0.2, retries=1000),
    )
    slow = plan(never=never).model_copy(update={"timeouts": Timeouts(startup_s=8)})
    with pytest.raises(Exception, match="startup_s"):
        await docker_env.open(slow)
    assert leftovers(engine, owner) == []


@pytest.mark.parametrize("after_s", [0.0, 1.0])
async def test_cancelling_open_while_services_start_leaves_nothing(
    engine: Any, owner: str, after_s: float
) -> None:
    """Cancelled as soon as a service container exists (`after_s` 0: while they are created
    and started), or during the healthchecks (`after_s` 1)."""
    env = make_env(f"{owner}-c")
    never = ServiceSpec(
        image=TEST_IMAGE,
        command=["sleep", "600"],
        healthcheck=Healthcheck(test=["false"], interval_s=0.2, retries=1000),
    )
    seen: list[str] = []
    async with anyio.create_task_group() as group:

        async def opening() -> None:
            session = await env.open(plan(web=WEB, never=never))
            await env.close(session)  # not reached: the healthcheck never passes

        group.start_soon(opening)
        deadline = time.monotonic() + 60
        while not (seen := service_names(engine, f"{owner}-c")):
            assert time.monotonic() < deadline, "no service container appeared"
            await anyio.sleep(0.02)
        await anyio.sleep(after_s)
        group.cancel_scope.cancel()
    assert seen
    assert leftovers(engine, f"{owner}-c") == []


async def test_attach_finds_the_services_and_close_removes_them(
    engine: Any, owner: str, docker_env: DockerEnvironment
) -> None:
    session = await docker_env.open(plan())
    other = make_env(owner)
    found = await other.attach(session.id)
    try:
        assert found.services == ("web", "db")
        assert await reads(found, DB_PORT, "web") == "db-ok"
        await found.write_text("/srv/web/x.txt", "via attach", service="web")
        assert await session.read_text("/srv/web/x.txt", service="web") == "via attach"
    finally:
        await other.close(found)
    assert leftovers(engine, owner) == []
    await docker_env.close(session)  # already gone: still safe


async def test_end_workload_leaves_the_services_running(docker_env: DockerEnvironment) -> None:
    async with docker_env.session(plan(web=WEB)) as session:
        await session.exec(["sh", "-c", "sleep 300 >/dev/null 2>&1 &"])
        before = await session.exec(["ps", "-eo", "pid,args"], service="web")
        await session.end_workload()
        after = await session.exec(["ps", "-eo", "pid,args"], service="web")
        mains = await session.exec(["ps", "-eo", "args"])
        assert "http.server" in before.stdout
        assert [line for line in after.stdout.splitlines() if "http.server" in line] == [
            line for line in before.stdout.splitlines() if "http.server" in line
        ]
        assert "sleep 300" not in mains.stdout


async def test_gc_removes_the_services_of_an_expired_session(engine: Any, owner: str) -> None:
    env = make_env(f"{owner}-gc")
    short = plan(web=WEB).model_copy(update={"timeouts": Timeouts(max_lifetime_s=4)})
    session = await env.open(short)
    web = f"corral-{session.id}-svc-web"
    sandbox = f"corral-{session.id}-sandbox"
    # The holder ends and removes itself, the sandbox ends (kept: see test_docker_expiry);
    # the service runs its own command.
    deadline = time.monotonic() + 15
    volume = f"corral-{session.id}-programs"
    left = sorted([f"corral-{session.id}", web, sandbox, volume])
    while sorted(leftovers(engine, f"{owner}-gc")) != left:
        assert time.monotonic() < deadline, leftovers(engine, f"{owner}-gc")
        await anyio.sleep(0.25)
    removed = await env.gc()
    assert sorted(removed) == sorted(
        [
            f"container {web}",
            f"container {sandbox}",
            f"network corral-{session.id}",
            f"volume {volume}",
        ]
    )
    assert leftovers(engine, f"{owner}-gc") == []
    await env.close(session)


async def test_a_warm_pool_hands_services_only_to_plans_that_name_them(
    engine: Any, owner: str
) -> None:
    env = make_env(owner)
    with_web = plan(web=WEB)
    async with env.warm_pool(with_web, size_per_key=1) as pool:
        await pool.ready()
        async with env.session(ExecutionPlan(image=TEST_IMAGE)) as bare:
            assert (pool.hits, pool.misses, bare.services) == (0, 1, ())
        async with env.session(with_web) as warm:
            assert (pool.hits, warm.services) == (1, ("web",))
            assert "http.server" in (await warm.exec(["ps", "-eo", "args"], service="web")).stdout
        await pool.ready()
        # `corral gc` of an idle pooled sandbox takes its services too.
        removed = await collect_idle(await env.engine(), env.config.owner, time.time() + 3600)
        assert len(removed) == 1 and service_names(engine, owner) == []
    assert leftovers(engine, owner) == []


async def test_services_behind_a_gateway_are_refused_before_anything_is_made(
    engine: Any, owner: str
) -> None:
    """gVisor takes the addresses of the namespace it joins: a service sharing it would
    lose them, so a gateway refuses services, naming them, and makes nothing."""
    env = make_env(owner, gateway=True)
    with pytest.raises(FeatureUnsupported, match="services \\(web\\)"):
        await env.open(plan("public", web=WEB))
    assert leftovers(engine, owner) == []
