"""save → fork on a real engine: a fork has the parent's files and nothing else of it (no
processes, no policy, no secret), and gc takes expired snapshot images."""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from docker.errors import ImageNotFound
from pydantic import SecretStr

from corral import ExecutionPlan, NetworkPolicy, NetworkSchedule
from corral.core.labels import EXPIRES_AT, OWNER, SESSION
from corral.core.snapshot import SnapshotRef
from corral.errors import ConfigError, ProviderError
from corral.providers.docker import snapshots
from corral.providers.docker.session import DockerSession
from corral.providers.docker.snapshots import PART
from corral.testing.servers import serve_tcp, stop_server
from tests.integration.conftest import ALLOWED_IP
from tests.integration.docker.conftest import TEST_IMAGE, leftovers, make_env

pytestmark = pytest.mark.anyio

SNAPSHOT = "corral.snapshot"
SECRET = f"s3cret-{secrets.token_hex(8)}"


def plan(baseline: str, **update: Any) -> ExecutionPlan:
    schedule = NetworkSchedule(baseline=NetworkPolicy.model_validate(baseline))
    return ExecutionPlan(image=TEST_IMAGE, network=schedule).model_copy(update=update)


@pytest.fixture
def target(target_link: None) -> Iterator[int]:
    """A TCP listener on the host's test address; its port."""
    server, thread = serve_tcp(ALLOWED_IP)
    yield server.getsockname()[1]
    stop_server(server, thread)


@pytest.fixture
def images(engine: Any) -> Iterator[list[str]]:
    """Snapshot images a test made, removed by id after it."""
    made: list[str] = []
    yield made
    for image in made:
        with contextlib.suppress(ImageNotFound):
            engine.api.remove_image(image)


def image_of(engine: Any, owner: str, ref: SnapshotRef) -> dict[str, Any]:
    found = engine.api.images(filters={"label": [f"{OWNER}={owner}", f"{SNAPSHOT}={ref.id}"]})
    assert len(found) == 1, found
    return engine.api.inspect_image(found[0]["Id"])


async def reaches(session: Any, port: int) -> bool:
    result = await session.exec(["nc", "-z", "-w", "3", ALLOWED_IP, str(port)])
    return result.returncode == 0


async def test_a_fork_has_the_files_not_the_processes_policy_or_secrets(
    engine: Any, owner: str, target: int, images: list[str]
) -> None:
    env = make_env(owner)
    parent_plan = plan("public", env={"API_TOKEN": SecretStr(SECRET)})
    async with env.session(parent_plan) as parent:
        await parent.write_text("/srv/state.txt", "saved by the parent")
        await parent.exec("setsid nohup sleep 1000 >/dev/null 2>&1 &")
        assert "sleep 1000" in (await parent.exec(["ps", "-eo", "args"])).stdout
        assert await reaches(parent, target)
        assert (await parent.exec(["printenv", "API_TOKEN"])).stdout.strip() == SECRET
        ref = await parent.save()
        image = image_of(engine, owner, ref)
        images.append(image["Id"])
        fork = await env.fork(ref, plan("no-network"))
        try:
            seen = {
                "file": await fork.read_text("/srv/state.txt"),
                "sleep": "sleep 1000" in (await fork.exec(["ps", "-eo", "args"])).stdout,
                "policy": fork.policy,
                "reaches": await reaches(fork, target),
                "token": (await fork.exec(["printenv", "API_TOKEN"])).returncode,
            }
            assert fork.id != parent.id and fork.image == image["Id"]
        finally:
            await env.close(fork)
        assert await reaches(parent, target), "the parent keeps its own policy"
    assert seen == {
        "file": "saved by the parent",
        "sleep": False,
        "policy": NetworkPolicy.no_network(),
        "reaches": False,
        "token": 1,
    }
    assert (ref.provider, ref.source_session) == ("docker", parent.id)
    labels = image["Config"]["Labels"]
    assert (labels[OWNER], labels[SESSION], labels[SNAPSHOT]) == (owner, parent.id, ref.id)
    assert int(labels[EXPIRES_AT]) == int(ref.expires_at.timestamp())
    assert SECRET not in json.dumps(image), "a secret value reached the snapshot image"
    assert not [e for e in image["Config"]["Env"] if e.startswith("API_TOKEN=")]
    assert not image["Config"]["Entrypoint"], "the parent's entrypoint reached the image"
    assert not [name for name in leftovers(engine, owner) if parent.id in name or fork.id in name]


def appends(word: str) -> ExecutionPlan:
    return plan("no-network", command=["sh", "-c", f"echo {word} >> /srv/runs; exec sleep 600"])


#: Waits for the parent's command to have written its line.
WRITTEN = "for i in $(seq 100); do [ -s /srv/runs ] && exit 0; sleep 0.1; done; exit 1"


async def runs(env: Any, engine: Any, images: list[str], parent: Any, child: Any) -> list[str]:
    """/srv/runs as a sandbox of plan `parent` saved it, then as its fork (plan `child`)
    has it once started."""
    async with env.session(parent) as source:
        ready = await source.exec(WRITTEN if parent.command else "touch /srv/runs")
        assert ready.returncode == 0
        saved = await source.read_text("/srv/runs")
        ref = await source.save()
    images.append(image_of(engine, env.config.owner, ref)["Id"])
    fork = await env.fork(ref, child)
    try:
        await anyio.sleep(0.5)  # time for a command to write, had one started
        return [saved, await fork.read_text("/srv/runs")]
    finally:
        await env.close(fork)


async def test_a_fork_runs_its_own_command_never_the_parents(
    engine: Any, owner: str, images: list[str]
) -> None:
    env = make_env(owner)
    quiet = plan("no-network")
    # Neither the parent's lifetime entrypoint in place of the fork's command, nor the
    # parent's command again.
    assert await runs(env, engine, images, quiet, appends("fork")) == ["", "fork\n"]
    assert await runs(env, engine, images, appends("parent"), quiet) == ["parent\n"] * 2


async def test_gc_removes_expired_snapshot_images_only(
    engine: Any, owner: str, images: list[str]
) -> None:
    short = make_env(owner, snapshot_lifetime_s=1)
    long = make_env(owner)
    async with short.session(plan("no-network")) as parent:
        expiring = await parent.save()
        # The same sandbox, through an environment whose snapshots live a day.
        kept = await long.attach(parent.id)
        kept_ref = await kept.save()
    images.extend(image_of(engine, owner, r)["Id"] for r in (expiring, kept_ref))
    await anyio.sleep(1.5)
    with pytest.raises(ConfigError, match=expiring.id):
        await short.fork(expiring, plan("no-network"))
    removed = await long.gc()
    assert f"snapshot {expiring.id}" in removed
    assert f"snapshot {kept_ref.id}" not in removed
    image_of(engine, owner, kept_ref)
    gone = engine.api.images(filters={"label": f"{SNAPSHOT}={expiring.id}"})
    assert gone == []


async def test_fork_of_an_unknown_snapshot_names_it(owner: str) -> None:
    env = make_env(owner)
    ref = SnapshotRef.model_validate(
        {
            "provider": "docker",
            "id": "nosuchsnap01",
            "created_at": "2026-01-01T00:00:00Z",
            "source_session": "abc",
            "expires_at": "2099-01-01T00:00:00Z",
        }
    )
    with pytest.raises(ConfigError, match="nosuchsnap01"):
        await env.fork(ref, plan("no-network"))


def test_snapshot_lifetime_is_validated(owner: str) -> None:
    with pytest.raises(ValueError, match="snapshot_lifetime_s"):
        make_env(owner, snapshot_lifetime_s=0)


@pytest.mark.parametrize("after_s", [0.05, 0.3])
async def test_a_save_cancelled_while_the_files_are_exported_leaves_no_image(
    engine: Any, owner: str, images: list[str], after_s: float
) -> None:
    # The export and import run in a worker thread the cancel waits for; the flat image it
    # made is removed before the cancellation goes on.
    env = make_env(owner)
    async with env.session(plan("no-network")) as session:
        await session.exec("head -c 20000000 /dev/urandom > /srv/blob")
        before = {image["Id"] for image in engine.api.images(all=True)}
        with anyio.move_on_after(after_s) as scope:
            images.append((await session.save()).id)
        assert scope.cancelled_caught, "the save finished before the cancel; export more"
        after = {image["Id"] for image in engine.api.images(all=True)}
        leaked = [engine.api.inspect_image(i)["Config"]["Labels"] for i in after - before]
        assert leaked == [], "a cancelled save left images behind"


async def test_a_save_cut_short_by_a_dead_harness_leaves_an_image_gc_takes(
    engine: Any, owner: str, images: list[str]
) -> None:
    # A harness killed between the import of the sandbox's files and the commit leaves the
    # flat image behind; it carries corral's labels (it used to carry none), so gc finds
    # it once expired, by exact identity.
    env = make_env(owner)
    async with env.session(plan("no-network")) as session:
        assert isinstance(session, DockerSession)
        labels = {OWNER: owner, SESSION: session.id, EXPIRES_AT: "1", PART: "cut-short"}
        made: list[str] = []
        await anyio.to_thread.run_sync(
            snapshots._flatten,  # pyright: ignore[reportPrivateUsage]
            engine.api,
            session.sandbox,
            labels,
            made,
        )
        images.extend(made)
    assert engine.api.inspect_image(made[0])["Config"]["Labels"] == labels
    removed = await env.gc()
    assert "snapshot part cut-short" in removed
    with pytest.raises(ImageNotFound):
        engine.api.inspect_image(made[0])


async def test_a_discarded_snapshot_is_gone_once_its_forks_are(
    engine: Any, owner: str, images: list[str]
) -> None:
    env = make_env(owner)
    async with env.session(plan("no-network")) as parent:
        ref = await parent.save()
    images.append(image_of(engine, owner, ref)["Id"])
    parts = engine.api.images(filters={"label": [f"{OWNER}={owner}", f"{PART}={ref.id}"]})
    # Another owner's environment neither sees nor removes it.
    await make_env(f"{owner}-other").discard_snapshot(ref)
    image_of(engine, owner, ref)
    fork = await env.fork(ref, plan("no-network"))
    try:
        with pytest.raises(ProviderError, match=f"{ref.id}.*close the fork"):
            await env.discard_snapshot(ref)
    finally:
        await env.close(fork)
    await env.discard_snapshot(ref)
    assert engine.api.images(filters={"label": f"{SNAPSHOT}={ref.id}"}) == []
    for part in parts:
        with pytest.raises(ImageNotFound):
            engine.api.inspect_image(part["Id"])
    await env.discard_snapshot(ref)  # gone is no error
    with pytest.raises(ConfigError, match=ref.id):
        await env.fork(ref, plan("no-network"))
