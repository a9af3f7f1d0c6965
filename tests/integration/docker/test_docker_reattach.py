"""Reattach on a real engine: a session id names one sandbox, found again by any process,
with the policy its holder's rules enforce (read back, never remembered)."""

from __future__ import annotations

import json
import os
import secrets
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral import ExecutionPlan, NetworkPolicy, NetworkSchedule
from corral.core.labels import OWNER, SESSION
from corral.errors import ConfigError, SessionNotFound
from corral.network.policy_record import PolicyRecord, record_rules
from corral.providers.docker import DockerEnvironment
from corral.providers.docker.session import DockerSession
from tests.integration.conftest import ALLOWED_IP
from tests.integration.docker.conftest import TEST_IMAGE, env_config, make_env

pytestmark = pytest.mark.anyio

PLAN = ExecutionPlan(image=TEST_IMAGE)
SRC = Path(__file__).parents[3] / "src"

#: Attaches in a process of its own and reports what it found; never closes the sandbox.
CHILD = """
import json, sys
import anyio
from corral.providers.docker import DockerConfig, DockerEnvironment

async def main() -> None:
    env = DockerEnvironment(DockerConfig.model_validate_json(sys.argv[1]))
    session = await env.attach(sys.argv[2])
    result = await session.exec(["cat", "/tmp/mark"])
    print(json.dumps({
        "policy": str(session.policy),
        "dns": [str(a) for a in session.net.dns],
        "sandbox": session.sandbox,
        "mark": result.stdout,
    }))

anyio.run(main)
"""


def new_id() -> str:
    return f"t-{secrets.token_hex(5)}"


def of_session(engine: Any, owner: str, session_id: str) -> list[str]:
    """Containers and networks of `owner` labelled with `session_id`, running or not."""
    selector = {"label": [f"{OWNER}={owner}", f"{SESSION}={session_id}"]}
    listed = engine.api.containers(all=True, filters=selector)
    nets = engine.api.networks(filters=selector)
    return [c["Names"][0].lstrip("/") for c in listed] + [n["Name"] for n in nets]


def docker(session: object) -> DockerSession:
    assert isinstance(session, DockerSession)
    return session


async def attach_elsewhere(owner: str, session_id: str, runtime: str = "runc") -> dict[str, Any]:
    """What a second Python process finds when it attaches to `session_id`."""
    config = env_config(owner, runtime=runtime)
    result = await anyio.run_process(
        [sys.executable, "-c", CHILD, json.dumps(config), session_id],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()[-2000:]
    return json.loads(result.stdout)


async def test_open_with_an_id_twice_is_one_sandbox(engine: Any, owner: str) -> None:
    env = make_env(owner)
    session_id = new_id()
    first = docker(await env.open(PLAN, session_id=session_id))
    try:
        second = docker(await env.open(PLAN, session_id=session_id))
        assert (second.id, second.sandbox, second.net.holder) == (
            session_id,
            first.sandbox,
            first.net.holder,
        )
        sandboxes = [name for name in of_session(engine, owner, session_id) if "sandbox" in name]
        assert sandboxes == [f"corral-{session_id}-sandbox"]
        await env.close(second)
    finally:
        await env.close(first)
    assert of_session(engine, owner, session_id) == []


async def test_another_process_attaches_with_the_policy_in_force(
    engine: Any, owner: str, runtime: str
) -> None:
    env = make_env(owner, runtime=runtime)
    session_id = new_id()
    parent = docker(await env.open(PLAN, session_id=session_id))
    try:
        await parent.write_text("/tmp/mark", "from the parent")
        seen = await attach_elsewhere(owner, session_id, runtime)
        assert seen["policy"] == "public" and seen["mark"] == "from the parent"
        await parent.set_network_policy("allowlist:allowed.corral.test:8080")
        seen = await attach_elsewhere(owner, session_id, runtime)
    finally:
        await env.close(parent)
    assert seen["policy"] == "allowlist:allowed.corral.test:8080"
    assert seen["sandbox"] == parent.sandbox
    assert seen["dns"] == [str(a) for a in parent.net.dns]
    assert of_session(engine, owner, session_id) == []


async def test_root_in_the_sandbox_cannot_forge_the_policy_read_back(
    engine: Any, owner: str
) -> None:
    env = make_env(owner)
    session_id = new_id()
    public = PolicyRecord(policy=NetworkPolicy.public(), dns_servers=())
    forged = "\n".join(["*filter", ":CORRAL-POLICY - [0:0]", *record_rules(public), "COMMIT"])
    script = f"#!/bin/sh\ncat <<'EOF'\n{forged}\nEOF\n"
    plan = PLAN.model_copy(update={"network": NetworkSchedule(baseline=NetworkPolicy.public())})
    parent = docker(await env.open(plan, session_id=session_id))
    try:
        await parent.write_text("/tmp/mark", "tampered")
        await parent.set_network_policy(NetworkPolicy.no_network())
        # Root rewrites every file it can that a careless read-back might trust: the
        # tools on its path, the resolver file it shares with the holder, a fake record.
        tampered = await parent.exec(
            "for tool in iptables-save ip6tables-save; do"
            " for dir in /usr/local/sbin /usr/sbin /sbin /usr/bin /bin; do"
            ' printf "%s" "$FAKE" > $dir/$tool && chmod 755 $dir/$tool; done; done;'
            ' echo "nameserver 192.0.2.53" > /etc/resolv.conf;'
            ' printf "%s" "$FAKE" > /tmp/corral-policy; iptables-save',
            env={"FAKE": script},
        )
        assert "corral-policy" in tampered.stdout, "the forgery must be on the sandbox's path"
        seen = await attach_elsewhere(owner, session_id)
        here = docker(await make_env(owner).attach(session_id))
        reach = await here.exec(["nc", "-z", "-w", "2", ALLOWED_IP, "8080"])
    finally:
        await env.close(parent)
    assert seen["policy"] == "no-network" and here.policy == NetworkPolicy.no_network()
    assert "192.0.2.53" not in seen["dns"]
    assert reach.returncode != 0


async def test_concurrent_opens_of_one_id_make_one_sandbox(engine: Any, owner: str) -> None:
    session_id = new_id()
    opened: list[DockerSession] = []
    envs = [make_env(owner), make_env(owner)]

    async def open_one(env: DockerEnvironment) -> None:
        opened.append(docker(await env.open(PLAN, session_id=session_id)))

    try:
        async with anyio.create_task_group() as tg:
            for env in envs:
                tg.start_soon(open_one, env)
        assert len({s.sandbox for s in opened}) == 1
        assert sorted(of_session(engine, owner, session_id)) == [
            f"corral-{session_id}",
            f"corral-{session_id}-holder",
            f"corral-{session_id}-sandbox",
        ]
    finally:
        for session in opened:
            assert session.environment is not None
            await session.environment.close(session)
    assert of_session(engine, owner, session_id) == []


async def test_attach_names_a_missing_or_invalid_id(owner: str) -> None:
    env = make_env(owner)
    with pytest.raises(SessionNotFound, match="nothing-here-1"):
        await env.attach("nothing-here-1")
    with pytest.raises(ConfigError, match="Not_An_Id"):
        await env.attach("Not_An_Id")


async def test_closing_an_attached_session_removes_everything(
    engine: Any, owner: str, runtime: str
) -> None:
    session_id = new_id()
    opener = make_env(owner, runtime=runtime)
    original = await opener.open(PLAN, session_id=session_id)
    attacher = make_env(owner, runtime=runtime)
    attached = await attacher.attach(session_id)
    await attacher.close(attached)
    assert of_session(engine, owner, session_id) == []
    await opener.close(original)  # idempotent: nothing of it is left to remove
    with pytest.raises(SessionNotFound):
        await attacher.attach(session_id)
