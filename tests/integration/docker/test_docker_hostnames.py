"""Exact hostnames in allowlists on a real engine, for names only an upstream resolver knows
(not in `extra_hosts`): corral's resolver in the holder is the sandbox's only resolver, as
for wildcards, and corral's own apply-time resolution reaches the upstream whatever rules
are in force (Docker's embedded resolver forwards from inside the sandbox's namespace,
where an allowlist refuses its packets).

The test's DNS server (conftest's `upstream`) is the upstream; nothing else knows its names.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from corral import NetworkPolicy
from corral.providers.docker import DockerEnvironment
from corral.providers.docker.session import DockerSession
from tests.integration.conftest import ALLOWED_IP, DENIED_IP
from tests.integration.docker.conftest import NAMES, make_env, nameservers
from tests.integration.docker.test_docker_wildcard import connects, plan, raw_query, resolves

pytestmark = pytest.mark.anyio

EXACT = "allowlist:a.allowed.test"


@pytest.fixture
def names_env(owner: str, upstream: str, runtime: str) -> DockerEnvironment:
    """Under each runtime (`RUNTIMES`): runsc behind a gateway."""
    return make_env(owner, upstream_dns_servers=[upstream], runtime=runtime)


async def test_a_switch_from_no_network_to_an_exact_name(
    names_env: DockerEnvironment, engine: Any
) -> None:
    async with names_env.session(plan("no-network", run=EXACT)) as sandbox:
        assert await resolves(sandbox, "a.allowed.test") is None
        await sandbox.set_network_policy(NetworkPolicy.model_validate(EXACT), phase="run")
        # Resolved at apply time: a static rule, reachable before the sandbox looks it up.
        assert await connects(sandbox, ALLOWED_IP)
        assert await resolves(sandbox, "a.allowed.test") == ALLOWED_IP
        assert await connects(sandbox, "a.allowed.test")
        # Another name: not resolved, and its address refused.
        assert await resolves(sandbox, "x.other.test") is None
        assert not await connects(sandbox, DENIED_IP)
        # A refresh that finds nothing moved leaves no rule of its lookup behind.
        assert isinstance(sandbox, DockerSession)
        await sandbox.refresh_names()
        output = engine.containers.get(sandbox.net.holder).exec_run(["iptables", "-S", "OUTPUT"])
        assert output.output.decode().split("\n")[1:] == ["-A OUTPUT -j CORRAL-EGRESS", ""]


async def test_an_exact_name_as_the_baseline(names_env: DockerEnvironment, runtime: str) -> None:
    dockers, corrals = nameservers(runtime)
    async with names_env.session(plan(EXACT)) as sandbox:
        conf = await sandbox.read_text("/etc/resolv.conf")
        assert f"nameserver {corrals}" in conf, conf
        assert await resolves(sandbox, "a.allowed.test") == ALLOWED_IP
        assert await connects(sandbox, "a.allowed.test")
        assert await resolves(sandbox, "b.allowed.test") is None  # a sibling: not listed
        assert await resolves(sandbox, "x.other.test") is None
        assert not await connects(sandbox, DENIED_IP)
        # corral's resolver refuses the rest; no other resolver answers at all.
        assert "rcode=5 answers=0" in await raw_query(sandbox, corrals, "x.other.test")
        for server in {ALLOWED_IP, dockers} - {corrals}:
            said = await raw_query(sandbox, server, "x.other.test")
            assert "rcode=" not in said, f"{server} answered: {said}"


async def test_a_switch_between_allowlists_of_names(names_env: DockerEnvironment) -> None:
    """The rules in force (an allowlist of other names) admit no unmarked DNS upstream:
    corral's resolution at apply time must not depend on them."""
    async with names_env.session(plan(EXACT)) as sandbox:
        await sandbox.set_network_policy(NetworkPolicy.allowlist("x.other.test"))
        assert await connects(sandbox, DENIED_IP)
        assert not await connects(sandbox, ALLOWED_IP)
        assert await resolves(sandbox, "x.other.test") == DENIED_IP
        assert await resolves(sandbox, "a.allowed.test") is None
        # extra_hosts entries (the harness's) still win, next to an upstream name.
        await sandbox.set_network_policy(
            NetworkPolicy.allowlist("allowed.corral.test", "x.other.test")
        )
        assert await resolves(sandbox, "allowed.corral.test") == ALLOWED_IP
        assert await connects(sandbox, "allowed.corral.test")
        assert await connects(sandbox, "x.other.test")


async def test_a_name_that_moves_is_followed_by_the_resolver(
    names_env: DockerEnvironment,
) -> None:
    """An answer the resolver gives after the apply is admitted for its TTL: a CDN name
    that moves stays reachable before any refresh."""
    async with names_env.session(plan("allowlist:moving.allowed.test")) as sandbox:
        assert isinstance(sandbox, DockerSession)
        assert await connects(sandbox, "moving.allowed.test")
        assert not await connects(sandbox, DENIED_IP)
        NAMES["moving.allowed.test"] = DENIED_IP
        try:
            assert await resolves(sandbox, "moving.allowed.test") == DENIED_IP
            assert await connects(sandbox, DENIED_IP)
            # A refresh follows the move into the static rules too.
            sandbox.refresh_bounds_s = (0.5, 1.0)
            async with sandbox.names_kept_current():
                with anyio.fail_after(20):
                    while True:
                        found = sandbox.net.resolution and sandbox.net.resolution.addresses.get(
                            "moving.allowed.test"
                        )
                        if found and [str(a) for a in found] == [DENIED_IP]:
                            break
                        await anyio.sleep(0.5)
            assert await connects(sandbox, DENIED_IP)
        finally:
            NAMES["moving.allowed.test"] = ALLOWED_IP
