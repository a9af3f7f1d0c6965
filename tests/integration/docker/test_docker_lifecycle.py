"""Open/close on a real engine: cancellation, bad input, gc, and a holder that lies."""

from __future__ import annotations

import io
import re
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from corral import (
    ENVIRONMENTS,
    ConfigError,
    ExecutionPlan,
    NetworkPolicyNotEnforced,
    NetworkPolicyUnsupported,
    ProviderError,
    Timeouts,
)
from corral.providers.docker import DockerConfig, DockerEnvironment
from tests.integration.conftest import effective_capabilities
from tests.integration.docker.conftest import HOLDER_IMAGE, TEST_IMAGE, leftovers, make_env

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("delay", [0.05, 0.2, 0.4, 0.7, 1.0, 1.4, 1.8, 2.4])
async def test_cancelling_open_at_any_point_leaves_nothing(
    engine: Any, owner: str, delay: float
) -> None:
    env = make_env(f"{owner}-c")
    with anyio.move_on_after(delay):
        session = await env.open(ExecutionPlan(image=TEST_IMAGE, network="no-network"))  # type: ignore[arg-type]
        await env.close(session)
    assert leftovers(engine, f"{owner}-c") == []


async def test_unknown_image_fails_fast_and_names_it(engine: Any, owner: str) -> None:
    env = make_env(owner)
    started = time.monotonic()
    with pytest.raises(ConfigError, match="no-such/image:1"):
        await env.open(ExecutionPlan(image="no-such/image:1"))
    assert time.monotonic() - started < 5
    assert leftovers(engine, owner) == []


async def test_engine_down_is_a_clear_error() -> None:
    env = DockerEnvironment(DockerConfig(base_url="unix:///run/corral-no-such.sock"))
    started = time.monotonic()
    with pytest.raises(ProviderError, match="corral-no-such.sock"):
        await env.open(ExecutionPlan(image=TEST_IMAGE))
    assert time.monotonic() - started < 15


def test_bad_config_names_the_value() -> None:
    with pytest.raises(ValueError, match="NET_ADMIN"):
        DockerConfig(capabilities=("CHOWN", "NET_ADMIN"))
    with pytest.raises(ValueError, match="10.0.0.1/8"):
        DockerConfig(address_pool="10.0.0.1/8")
    with pytest.raises(ValueError, match="nope"):
        DockerConfig.model_validate({"nope": 1})
    with pytest.raises(ValueError, match="/a/b/c"):
        DockerConfig(mounts=("/a/b/c",))
    assert "hunter2" not in repr(DockerConfig(registry_password="hunter2"))  # type: ignore[arg-type]


async def test_unsafe_config_is_refused_or_opted_into_and_logged(
    engine: Any, owner: str, caplog: pytest.LogCaptureFixture
) -> None:
    refused = [
        {"mounts": ("/var/run/docker.sock:/var/run/docker.sock",)},
        {"mounts": ("/:/host",)},
        {"capabilities": ("SYS_MODULE",)},
        {"unsafe_capabilities": ("NET_ADMIN",)},
    ]
    for params in refused:
        with pytest.raises(ValueError, match=re.escape(next(iter(params.values()))[0])):
            ENVIRONMENTS.create("docker", owner=owner, **params)
    assert leftovers(engine, owner) == []
    env = make_env(owner, unsafe_capabilities=("SYS_PTRACE",))
    with caplog.at_level("WARNING", logger="corral.environment"):
        async with env.session(ExecutionPlan(image=TEST_IMAGE)) as sandbox:
            granted = await effective_capabilities(sandbox)
    assert "unsafe configuration in force provider=docker unsafe_capabilities=SYS_PTRACE" in (
        caplog.text
    )
    assert granted == {"SYS_PTRACE"}, "the opt-in is granted, never NET_ADMIN or NET_RAW"


async def test_unenforceable_policy_is_refused_before_anything_exists(
    engine: Any, owner: str
) -> None:
    env = make_env(owner)
    # A denylist cannot hold a wildcard: the sandbox may use any resolver in a denylist.
    plan = ExecutionPlan(image=TEST_IMAGE, network="denylist:*.corral.test")  # type: ignore[arg-type]
    with pytest.raises(NetworkPolicyUnsupported, match=r"\*\.corral\.test.*baseline"):
        await env.open(plan)
    assert leftovers(engine, owner) == []


async def test_gc_removes_only_expired_sessions(engine: Any, owner: str) -> None:
    env = make_env(f"{owner}-gc")
    other = make_env(f"{owner}-other")
    short = ExecutionPlan(image=TEST_IMAGE, timeouts=Timeouts(max_lifetime_s=3))
    stale = await env.open(short)
    foreign = await other.open(short)
    fresh = await env.open(ExecutionPlan(image=TEST_IMAGE))
    # Expired containers end and the holders remove themselves; the stopped sandboxes,
    # networks and volumes are left to gc.
    expired = ("", "-sandbox", "-programs")
    fresh_names = [f"corral-{fresh.id}{part}" for part in (*expired, "-holder")]
    left = {
        f"{owner}-gc": sorted([f"corral-{stale.id}{part}" for part in expired] + fresh_names),
        f"{owner}-other": sorted(f"corral-{foreign.id}{part}" for part in expired),
    }
    deadline = time.monotonic() + 10
    while {key: sorted(leftovers(engine, key)) for key in left} != left:
        assert time.monotonic() < deadline, [leftovers(engine, key) for key in left]
        await anyio.sleep(0.25)
    removed = await env.gc()
    assert removed == [
        f"container corral-{stale.id}-sandbox",
        f"network corral-{stale.id}",
        f"volume corral-{stale.id}-programs",
    ]
    assert (await fresh.exec(["true"])).returncode == 0
    assert sorted(leftovers(engine, f"{owner}-other")) == left[f"{owner}-other"], (
        "gc touched another"
    )
    await env.close(stale)  # already collected: close is still safe
    await env.close(fresh)
    await other.close(foreign)
    assert leftovers(engine, f"{owner}-gc") == [] and leftovers(engine, f"{owner}-other") == []


@pytest.fixture(scope="module")
def lying_holder(engine: Any) -> Iterator[str]:
    """A holder whose iptables-restore accepts the payload and installs nothing."""
    tag = "corral.local/holder-lying:test"
    dockerfile = (
        f"FROM {HOLDER_IMAGE}\n"
        "RUN for t in iptables-restore ip6tables-restore; do "
        "rm /usr/sbin/$t; printf '#!/bin/sh\\ncat >/dev/null\\n' > /usr/sbin/$t; "
        "chmod +x /usr/sbin/$t; done\n"
    )
    engine.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True)
    yield tag
    engine.images.remove(tag, force=True)


async def test_unenforced_policy_raises_and_leaves_nothing(
    engine: Any, owner: str, lying_holder: str
) -> None:
    env = make_env(f"{owner}-lie", holder_image=lying_holder)
    with pytest.raises(NetworkPolicyNotEnforced, match="got through|not through"):
        await env.open(ExecutionPlan(image=TEST_IMAGE, network="no-network"))  # type: ignore[arg-type]
    assert leftovers(engine, f"{owner}-lie") == []


async def test_unenforced_switch_closes_the_session(
    engine: Any, owner: str, lying_holder: str
) -> None:
    env = make_env(f"{owner}-lie2", holder_image=lying_holder)
    session = await env.open(ExecutionPlan(image=TEST_IMAGE))
    with pytest.raises(NetworkPolicyNotEnforced, match="session was closed"):
        await session.set_network_policy("no-network")
    assert session.closed
    assert leftovers(engine, f"{owner}-lie2") == []
