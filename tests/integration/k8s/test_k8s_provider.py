"""The `k8s` provider on a real cluster: NetworkPolicy objects, enforcement, lifecycle."""

from __future__ import annotations

import hashlib
import os
import signal
import time
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from corral import (
    ConfigError,
    EnvironmentSession,
    ExecutionPlan,
    NetworkPolicy,
    NetworkPolicyNotEnforced,
    NetworkSchedule,
    ProviderError,
)
from corral.providers.k8s import KubernetesEnvironment
from corral.testing.plugin import EgressTarget
from tests.integration.conftest import ALLOWED_IP, effective_capabilities, unavailable
from tests.integration.enforcement_cases import flows_across_a_switch
from tests.integration.k8s.conftest import RUNTIME_CLASSES, TEST_IMAGE, make_env

pytestmark = pytest.mark.anyio

ENFORCER_PID = Path("/run/corral-cluster/pids/kube-router.pid")


def plan(policy: str | NetworkPolicy) -> ExecutionPlan:
    return ExecutionPlan(
        image=TEST_IMAGE, network=NetworkSchedule.model_validate({"baseline": policy})
    )


def policy_objects(cluster: Any, namespace: str, session: str) -> list[Any]:
    listed: Any = cluster.networking.list_namespaced_network_policy(
        namespace, label_selector=f"corral.session={session}"
    )
    return list(listed.items)


def objects(cluster: Any, namespace: str, owner: str) -> list[str]:
    selector = f"corral.owner={owner}"
    pods: Any = cluster.core.list_namespaced_pod(namespace, label_selector=selector)
    nps: Any = cluster.networking.list_namespaced_network_policy(namespace, label_selector=selector)
    return [p.metadata.name for p in pods.items] + [p.metadata.name for p in nps.items]


async def tcp(sandbox: EnvironmentSession, target: EgressTarget) -> bool:
    result = await sandbox.exec(["nc", "-z", "-w", "3", target.host, str(target.port)])
    return result.returncode == 0


async def test_network_policy_follows_the_session(
    cluster: Any, namespace: str, k8s_env: KubernetesEnvironment
) -> None:
    sandbox = await k8s_env.open(plan("no-network"))
    (created,) = policy_objects(cluster, namespace, sandbox.id)
    assert created.spec.egress in (None, [])
    owner = created.metadata.owner_references[0]
    assert (owner.kind, owner.name) == ("Pod", f"corral-{sandbox.id}")
    await sandbox.set_network_policy(NetworkPolicy.allowlist(f"{ALLOWED_IP}:80"))
    (patched,) = policy_objects(cluster, namespace, sandbox.id)
    assert patched.metadata.uid == created.metadata.uid, "a switch patches, never recreates"
    assert patched.spec.egress[0].to[0].ip_block.cidr == f"{ALLOWED_IP}/32"
    await k8s_env.close(sandbox)
    assert policy_objects(cluster, namespace, sandbox.id) == []


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("public", (True, True)),
        ("no-network", (False, False)),
        ("allowlist:{allowed}", (True, False)),
        ("denylist:{denied}", (True, False)),
    ],
)
async def test_modes_toward_test_servers(
    runtime_env: KubernetesEnvironment,
    tcp_targets: list[EgressTarget],
    policy: str,
    expected: tuple[bool, bool],
) -> None:
    allowed, denied = tcp_targets
    text = policy.format(allowed=str(allowed), denied=str(denied))
    async with runtime_env.session(plan(text)) as sandbox:
        seen = (await tcp(sandbox, allowed), await tcp(sandbox, denied))
    assert seen == expected


async def test_modes_between_pods(runtime_env: KubernetesEnvironment, plain_server: str) -> None:
    """Egress toward another Pod follows the policy like any destination.

    A switch returns once what the new policy forbids is refused (probed); what it newly
    allows opens when the CNI next syncs (kube-router: within a few seconds), which no
    probe can see from inside the Pod, so that last step is polled."""
    target = EgressTarget(plain_server, 9000)
    seen: list[bool] = []
    async with runtime_env.session(plan("public")) as client:
        seen.append(await tcp(client, target))
        await client.set_network_policy(NetworkPolicy.no_network())
        seen.append(await tcp(client, target))
        await client.set_network_policy(NetworkPolicy.allowlist(f"{plain_server}:9000"))
        opened = False
        for _ in range(30):
            if opened := await tcp(client, target):
                break
            await anyio.sleep(0.5)
        seen.append(opened)
    assert seen == [True, False, True]


async def test_switch_while_a_flow_is_open(
    runtime_env: KubernetesEnvironment, udp_targets: list[EgressTarget]
) -> None:
    """The switch lands while a flow is open, and from then on new flows are refused.

    Unlike the Docker provider, an already established flow may outlive the switch here:
    the CNI (kube-router, like most) accepts conntrack-established traffic first, and a
    Pod has no way to flush conntrack. That is documented; new flows are what is checked.
    """
    async with runtime_env.session(plan("public")) as sandbox:
        flows = await flows_across_a_switch(sandbox, ALLOWED_IP, udp_targets[0].port)
    assert flows[0] == ("ok", "ok"), flows
    assert flows[-1][1] == "blocked", flows


@pytest.mark.parametrize("delay", [0.1, 0.5, 1.0, 2.0, 3.5])
async def test_cancelling_open_leaves_nothing(cluster: Any, namespace: str, delay: float) -> None:
    owner = f"cancel-{int(delay * 10)}"
    env = make_env(namespace, owner=owner)
    with anyio.move_on_after(delay):
        session = await env.open(plan("no-network"))
        await env.close(session)
    assert objects(cluster, namespace, owner) == []


async def test_unknown_image_fails_fast_naming_it(cluster: Any, namespace: str) -> None:
    env = make_env(namespace, owner="badimage")
    started = time.monotonic()
    with pytest.raises(ConfigError, match="no-such/image:1"):
        await env.open(ExecutionPlan(image="no-such/image:1"))
    assert time.monotonic() - started < 30
    assert objects(cluster, namespace, "badimage") == []


async def test_missing_namespace_and_unreachable_server() -> None:
    env = make_env("corral-missing-ns", create_namespace=False)
    with pytest.raises(ConfigError, match="corral-missing-ns"):
        await env.open(plan("public"))
    started = time.monotonic()
    bad = KubernetesEnvironment(kubeconfig="/nonexistent/kubeconfig")
    with pytest.raises(ProviderError, match="/nonexistent/kubeconfig"):
        await bad.open(plan("public"))
    assert time.monotonic() - started < 10


async def test_unsafe_config_is_refused_or_opted_into_and_logged(
    cluster: Any, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    refused = {
        "privileged": {"security_context": {"privileged": True}},
        "spc_t": {"security_context": {"seLinuxOptions": {"type": "spc_t"}}},
        "SYS_MODULE": {"security_context": {"capabilities": {"add": ["SYS_MODULE"]}}},
        "NET_RAW": {"unsafe_capabilities": ["NET_RAW"]},
    }
    for named, params in refused.items():
        with pytest.raises(ValueError, match=named):
            make_env(namespace, owner="unsafe", **params)
    assert objects(cluster, namespace, "unsafe") == []
    env = make_env(namespace, owner="unsafe", unsafe_capabilities=["SYS_PTRACE"])
    with caplog.at_level("WARNING", logger="corral.environment"):
        async with env.session(plan("public")) as sandbox:
            granted = await effective_capabilities(sandbox)
    assert "unsafe configuration in force provider=k8s unsafe_capabilities=SYS_PTRACE" in (
        caplog.text
    )
    assert granted == {"SYS_PTRACE"}, "the opt-in is granted, never NET_ADMIN or NET_RAW"
    assert objects(cluster, namespace, "unsafe") == []


@contextmanager
def paused_enforcer() -> Generator[None]:
    """kube-router frozen (SIGSTOP), so NetworkPolicies are not programmed: the cluster
    then fails open, as kind's kindnetd does."""
    if not ENFORCER_PID.exists():
        unavailable(f"no {ENFORCER_PID}: this test needs the cluster of cluster/up.sh")
    pid = int(ENFORCER_PID.read_text().strip())
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize("runtime", list(RUNTIME_CLASSES))
async def test_unenforced_policy_is_detected(
    cluster: Any,
    namespace: str,
    runtime_classes: dict[str, str | None],
    runtime: str,
) -> None:
    env = make_env(
        namespace,
        owner="failopen",
        verify_timeout_s=4,
        runtime_class_name=runtime_classes[runtime],
    )
    with paused_enforcer(), pytest.raises(NetworkPolicyNotEnforced, match="does not enforce"):
        await env.open(plan("no-network"))
    assert objects(cluster, namespace, "failopen") == []


@pytest.mark.parametrize("runtime", list(RUNTIME_CLASSES))
async def test_a_narrowing_switch_the_cni_never_takes_is_detected(
    cluster: Any,
    namespace: str,
    plain_server: str,
    runtime_classes: dict[str, str | None],
    runtime: str,
) -> None:
    """From an allowlist naming a Pod to no-network while the CNI is frozen: the switch
    fails closed. The node's port every non-public policy forbids cannot show that the
    CNI took it (that port was refused before the switch too); what the old policy let
    through and the new one forbids can."""
    allow = NetworkPolicy.allowlist(f"{plain_server}:9000")
    env = make_env(
        namespace,
        owner="narrowing",
        verify_timeout_s=4,
        runtime_class_name=runtime_classes[runtime],
    )
    sandbox = await env.open(plan(allow))
    try:
        for _ in range(30):
            if await tcp(sandbox, EgressTarget(plain_server, 9000)):
                break
            await anyio.sleep(0.5)
        else:
            pytest.fail(f"{plain_server}:9000 never opened under {allow}")
        with paused_enforcer(), pytest.raises(NetworkPolicyNotEnforced, match="still answered"):
            await sandbox.set_network_policy(NetworkPolicy.no_network())
    finally:
        await env.close(sandbox)
    assert objects(cluster, namespace, "narrowing") == []


async def test_a_large_tree_comes_back_whole(
    k8s_env: KubernetesEnvironment, tmp_path: Path
) -> None:
    # The kubernetes client's own read loop lost bytes of large exec outputs: a 50 MB
    # tree's tar came back short (3 downloads in 4) and took ~10x `kubectl cp`.
    make = "mkdir /tmp/big; for i in $(seq 40); do head -c 1000000 /dev/urandom >/tmp/big/f$i; done"
    async with k8s_env.session(plan("no-network")) as sandbox:
        assert (await sandbox.exec(["sh", "-c", make], timeout=120)).returncode == 0
        sums = await sandbox.exec(["sh", "-c", "cd /tmp/big && sha256sum f*"], timeout=60)
        started = time.monotonic()
        await sandbox.download_dir("/tmp/big", tmp_path / "big")
        taken = time.monotonic() - started
    expected = dict(line.split()[::-1] for line in sums.stdout.splitlines())
    got = {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in (tmp_path / "big").iterdir()
    }
    assert got == expected
    assert taken < 30, f"40 MB took {taken:.1f} s"


@pytest.mark.parametrize("call", ["download", "download_dir", "upload"])
async def test_a_transfer_cancelled_midway_stops_within_a_poll(
    k8s_env: KubernetesEnvironment, tmp_path: Path, call: str
) -> None:
    """A transfer ran in a worker thread that nothing could stop: a cancelled download of
    a large file went on to its end (and wrote it) while the caller waited."""
    size = 600 << 20
    source = tmp_path / "big.bin"
    with source.open("wb") as out:
        out.truncate(size)
    async with k8s_env.session(plan("no-network")) as sandbox:
        made = await sandbox.exec(
            ["sh", "-c", f"mkdir /tmp/d && head -c {size} /dev/zero > /tmp/d/big"], timeout=120
        )
        assert made.returncode == 0, made
        transfers = {
            "download": lambda: sandbox.download("/tmp/d/big", tmp_path / "got.bin"),
            "download_dir": lambda: sandbox.download_dir("/tmp/d", tmp_path / "got"),
            "upload": lambda: sandbox.upload(source, "/tmp/up.bin"),
        }
        started = time.monotonic()
        with anyio.move_on_after(1.0) as scope:
            await transfers[call]()
        stopped = time.monotonic() - started
        after = await sandbox.exec(["sh", "-c", "ls -l /tmp/up.bin 2>/dev/null; true"])
    assert scope.cancelled_caught, f"{call} of {size} bytes ended within 1 s: not midway"
    assert stopped < 3, f"the cancelled {call} returned after {stopped:.1f} s"
    assert not (tmp_path / "got.bin").exists(), "a cancelled download wrote its file"
    assert str(size) not in after.stdout, "a cancelled upload arrived whole"
