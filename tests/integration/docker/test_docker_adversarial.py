"""An agent that is root in the sandbox tries to outlive its phase, steer name resolution,
or keep a wider policy after a failed switch; each attempt fails on a real engine."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from corral import EnvironmentSession, ExecutionPlan, NetworkPolicy, NetworkSchedule, TaskRun
from corral.errors import CorralError, NetworkPolicyNotEnforced
from corral.providers.docker import DockerEnvironment
from corral.providers.docker.session import DockerSession
from corral.testing.plugin import EgressTarget
from tests.integration.conftest import ALLOWED_IP, DENIED_IP, TCP_PORT, unavailable
from tests.integration.docker.conftest import NAMES, TEST_IMAGE, leftovers, make_env

pytestmark = pytest.mark.anyio

# Each loop bumps its own counter file and dials the allowed target, forever.
LOOP = "while :; do echo x >> /tmp/count-{tag}; nc -z -w 1 {ip} {port}; sleep 0.2; done"
ESCAPES = {
    "setsid": "setsid nohup sh -c '{loop}' >/dev/null 2>&1 &",
    "double-fork": "( ( sh -c '{loop}' >/dev/null 2>&1 & ) & )",
    "renamed": "nohup bash -c 'exec -a kworker/0:1 sh -c \"{loop}\"' >/dev/null 2>&1 &",
}


async def reachable(sandbox: EnvironmentSession, ip: str, port: int = TCP_PORT) -> bool:
    result = await sandbox.exec(["nc", "-z", "-w", "3", ip, str(port)])
    return result.returncode == 0


async def counts(sandbox: EnvironmentSession) -> dict[str, int]:
    result = await sandbox.exec("for f in /tmp/count-*; do echo $f $(wc -l < $f); done")
    pairs = (line.split() for line in result.stdout.splitlines() if line.strip())
    return {name: int(n) for name, n in pairs if n.isdigit()}


async def test_run_phase_processes_do_not_outlive_the_run(
    docker_env: DockerEnvironment, tcp_targets: list[EgressTarget]
) -> None:
    schedule = NetworkSchedule(
        baseline=NetworkPolicy.public(),
        run=NetworkPolicy.no_network(),
        evaluation=NetworkPolicy.public(),
    )
    plan = ExecutionPlan(image=TEST_IMAGE, network=schedule)
    async with TaskRun(docker_env, plan) as run:
        async with run.running() as sandbox:
            for name, template in ESCAPES.items():
                for user in ("0", "1000"):
                    loop = LOOP.format(tag=f"{name}-{user}", ip=ALLOWED_IP, port=TCP_PORT)
                    started = await sandbox.exec(template.format(loop=loop), user=user)
                    assert started.returncode == 0, started
            await sandbox.exec(["sleep", "1"])
            assert len(await counts(sandbox)) == 2 * len(ESCAPES)

        async def evaluation(session: EnvironmentSession) -> tuple[str, dict[str, int]]:
            table = await session.exec(["ps", "-eo", "pid,user,args"])
            first = await counts(session)
            await session.exec(["sleep", "1.5"])
            assert await counts(session) == first, "a run-phase loop still runs"
            return table.stdout, first

        table, _ = await run.evaluate(evaluation)
        assert "count-" not in table and "kworker" not in table, table
        assert "nc -z" not in table, table
        # The restore to baseline comes with its own kill: still nothing runs.
        after = await run.session.exec(["ps", "-eo", "args"])
        assert "count-" not in after.stdout


async def test_agent_cannot_choose_what_a_name_resolves_to(
    docker_env: DockerEnvironment, tcp_targets: list[EgressTarget]
) -> None:
    plan = ExecutionPlan(image=TEST_IMAGE)
    async with docker_env.session(plan) as sandbox:
        # Root in the sandbox owns /etc/hosts, which the holder's namespace shares.
        forged = (
            f"printf '%s api.innocent.example\\n%s allowed.corral.test\\n' {DENIED_IP} "
            f"{DENIED_IP} > /tmp/h && cat /etc/hosts >> /tmp/h && cat /tmp/h > /etc/hosts"
        )
        assert (await sandbox.exec(forged)).returncode == 0
        assert (await sandbox.exec(["getent", "hosts", "allowed.corral.test"])).stdout.startswith(
            DENIED_IP
        )

        await sandbox.set_network_policy(f"allowlist:allowed.corral.test:{TCP_PORT}")
        assert await reachable(sandbox, ALLOWED_IP), "the harness's address must be allowed"
        assert not await reachable(sandbox, DENIED_IP), "the agent's forged address got through"

        # A name only the agent knows resolves to nothing: it allows nothing.
        await sandbox.set_network_policy(f"allowlist:api.innocent.example:{TCP_PORT}")
        assert not await reachable(sandbox, DENIED_IP)

        # Nor can it un-deny a denied name by pointing it elsewhere.
        await sandbox.exec(
            "sed -i 's/^.*denied.corral.test$/127.0.0.2 denied.corral.test/' /etc/hosts"
        )
        await sandbox.set_network_policy("denylist:denied.corral.test")
        assert not await reachable(sandbox, DENIED_IP)
        assert await reachable(sandbox, ALLOWED_IP)


async def test_a_failed_switch_leaves_no_network(
    docker_env: DockerEnvironment, tcp_targets: list[EgressTarget]
) -> None:
    plan = ExecutionPlan(image=TEST_IMAGE)
    async with docker_env.session(plan) as sandbox:
        assert await reachable(sandbox, ALLOWED_IP)
        # A denied name nobody can resolve cannot be applied.
        with pytest.raises(CorralError) as failure:
            await sandbox.set_network_policy("denylist:nowhere.corral.invalid")
        assert "no network" in "".join(getattr(failure.value, "__notes__", []))
        assert sandbox.policy == NetworkPolicy.no_network()
        assert not await reachable(sandbox, ALLOWED_IP), "the old, wider policy stayed"
        assert (await sandbox.exec(["true"])).returncode == 0


def _moved_to(sandbox: DockerSession, address: str) -> bool:
    found = (
        sandbox.net.resolution.addresses.get("moving.allowed.test")
        if sandbox.net.resolution
        else None
    )
    return [str(a) for a in found or ()] == [address]


async def test_a_name_that_moves_stays_allowed(owner: str, upstream: str) -> None:
    """The name's upstream answer changes, as a CDN's would: the refresh follows it, and
    the address it moved away from is refused again. (Under an allowlist that names a
    host, names resolve through the upstream, never Docker's embedded resolver.)"""
    env = make_env(owner, upstream_dns_servers=[upstream])
    async with env.session(ExecutionPlan(image=TEST_IMAGE)) as sandbox:
        assert isinstance(sandbox, DockerSession)
        sandbox.refresh_bounds_s = (0.5, 1.0)
        await sandbox.set_network_policy(f"allowlist:moving.allowed.test:{TCP_PORT}")
        assert await reachable(sandbox, ALLOWED_IP)
        assert not await reachable(sandbox, DENIED_IP)
        NAMES["moving.allowed.test"] = DENIED_IP
        try:
            async with sandbox.names_kept_current():
                with anyio.fail_after(20):
                    # Until a refresh has applied the move whole (leaving the block cancels
                    # one under way).
                    while not _moved_to(sandbox, DENIED_IP):  # noqa: ASYNC110
                        await anyio.sleep(0.5)
            assert await reachable(sandbox, DENIED_IP)
            assert not await reachable(sandbox, ALLOWED_IP)
        finally:
            NAMES["moving.allowed.test"] = ALLOWED_IP


# Registered by engine.sh: `corral-test-bypass` (bypass-runtime.sh) is runc, but the
# container stays out of the namespace Docker gives it; `runsc` is gVisor, whose own network
# stack keeps its packets out of the namespace's netfilter when it shares the holder's
# (`gateway=False`; behind its default gateway it meets the rules: test_docker_enforcement).
# The bypass stays out of a gateway's namespace just the same.
SKIPPING = [("corral-test-bypass", False), ("corral-test-bypass", True), ("runsc", False)]


@pytest.mark.parametrize(("runtime", "gateway"), SKIPPING)
async def test_a_runtime_whose_packets_skip_the_rules_is_caught(
    engine: Any, owner: str, tcp_targets: list[EgressTarget], runtime: str, gateway: bool
) -> None:
    if runtime not in (engine.info().get("Runtimes") or {}):
        unavailable(f"no Docker runtime {runtime!r}: run tests/integration/docker/engine.sh up")
    env = make_env(owner, runtime=runtime, gateway=gateway)
    async with env.session(ExecutionPlan(image=TEST_IMAGE)) as session:
        # Under `public` nothing is forbidden, so nothing can be caught yet; but the
        # sandbox's packets really are outside the holder's rules.
        assert await reachable(session, ALLOWED_IP)
        # The bypass is caught by the sandbox's own probe, which names the runtime; gVisor
        # took the holder's address for its own stack, so the holder's probe fails first,
        # uncounted by the rules (closed either way).
        caught = runtime if runtime == "corral-test-bypass" else "not through corral's rules"
        with pytest.raises(NetworkPolicyNotEnforced, match=caught):
            await session.set_network_policy(NetworkPolicy.no_network())
        assert session.closed
    plan = ExecutionPlan(
        image=TEST_IMAGE, network=NetworkSchedule(baseline=NetworkPolicy.no_network())
    )
    with pytest.raises(NetworkPolicyNotEnforced, match="did not meet corral's rules"):
        await env.open(plan)
    assert leftovers(engine, owner) == []
