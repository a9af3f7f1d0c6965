"""Kubernetes rows: Pod open with `no-network` enforced vs `kubectl run` + wait Ready,
exec (through the exec channel, and plain) vs `kubectl exec`, a policy patch until the
probe sees it enforced, a warm-pool claim vs a cold open of the same plan, directory
transfers vs `kubectl cp` (k8s_transfer), the open, exec and switch rows again under gVisor
beside runc (runtimes), and many Pods opened at once (k8s_scale: 100 in a full run, a
fifth with --quick).

Runs against KUBECONFIG (default: the cluster of tests/integration/cluster/up.sh) in a
namespace of its own, removed at the end; skipped with the reason when no cluster answers.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio

from bench.cases.k8s_scale import FULL, scale_rows
from bench.cases.k8s_transfer import transfer_rows
from bench.cases.runtimes import RUNTIME_CLASS, runtime_rows
from bench.context import TEST_IMAGE, Context, timed, timed_sync
from bench.report import Row, ratio_at_most
from bench.stats import Summary, summarize
from corral import ExecutionPlan, NetworkPolicy
from corral.core.session import ExecRequest
from corral.providers.k8s import KubernetesConfig, KubernetesEnvironment
from corral.providers.k8s.channel import ChannelExecutor
from corral.providers.k8s.session import KubernetesSession

#: issue 14: exec through the channel at most this times `kubectl exec`'s p50
CHANNEL_TARGET = 0.25
DEFAULT_KUBECONFIG = "/var/lib/corral-cluster/admin.kubeconfig"
CACHED_KUBECTL = "/var/cache/corral/cluster/kubernetes-v1.34.4/bin/kubectl"
#: issue 23: a cold Pod open at most this times `kubectl run` + wait Ready
OPEN_TARGET = 1.5
#: issue 23: a warm-pool claim (label, NetworkPolicy patch to the baseline, probe) at most
#: this times a cold open's p50
POOL_TARGET = 0.15


def _locate() -> tuple[str, str] | None:
    """(kubeconfig, kubectl) when both are there."""
    kubeconfig = os.environ.get("KUBECONFIG") or DEFAULT_KUBECONFIG
    kubectl = shutil.which("kubectl") or (CACHED_KUBECTL if Path(CACHED_KUBECTL).exists() else None)
    if kubectl is None or not Path(kubeconfig).exists():
        return None
    return kubeconfig, kubectl


async def run(ctx: Context) -> list[Row]:
    found = _locate()
    if found is None:
        reason = "skipped: no kubeconfig or no kubectl; run tests/integration/cluster/up.sh"
        return [Row("k8s: open, exec, policy", note=reason)]
    kubeconfig, kubectl = found
    namespace = f"corral-bench-{secrets.token_hex(3)}"
    config = KubernetesConfig(
        kubeconfig=kubeconfig,
        namespace=namespace,
        create_namespace=True,
        image_pull_policy="Never",
        owner=ctx.owner,
    )
    env = KubernetesEnvironment(config)
    gvisor = KubernetesEnvironment(config.model_copy(update={"runtime_class_name": RUNTIME_CLASS}))
    base = [kubectl, "--kubeconfig", kubeconfig, "-n", namespace]
    plan = ExecutionPlan.model_validate({"image": TEST_IMAGE, "network": "no-network"})
    rows: list[Row] = []
    try:
        for name, part in (
            ("k8s: open, exec, policy", lambda: _rows(ctx, env, base)),
            ("k8s: warm pool", lambda: _pool_rows(ctx, env)),
            ("k8s: transfer", lambda: transfer_rows(ctx, env, base, plan)),
            ("k8s under gVisor", lambda: _gvisor_rows(ctx, gvisor, env, base, plan)),
            ("k8s: Pods at once", lambda: scale_rows(env, kubeconfig, plan, ctx.reps(FULL))),
        ):
            try:
                rows += await part()
            except Exception as exc:  # one part failing leaves the others' rows
                rows.append(Row(name, note=f"failed: {exc!r}"))
        return rows
    finally:
        await gvisor.aclose()
        await env.aclose()
        await anyio.run_process(
            [*base[:3], "delete", "namespace", namespace, "--wait=false"], check=False
        )


async def _gvisor_rows(
    ctx: Context,
    gvisor: KubernetesEnvironment,
    env: KubernetesEnvironment,
    base: list[str],
    plan: ExecutionPlan,
) -> list[Row]:
    found = await anyio.run_process([*base[:3], "get", "runtimeclass", RUNTIME_CLASS], check=False)
    if found.returncode != 0:
        reason = (
            f"skipped: no RuntimeClass {RUNTIME_CLASS!r} in the cluster; "
            "tests/integration/cluster/up.sh registers gVisor's"
        )
        return [Row("k8s under gVisor", note=reason)]
    return await runtime_rows(
        ctx,
        gvisor,
        env,
        plan,
        where="k8s",
        cases=(
            "Pod open, no-network enforced",
            "exec `true` (channel)",
            "switch public → no-network (patch, probe refused)",
        ),
    )


def _kubectl_run(base: list[str], name: str) -> None:
    subprocess.run(
        [
            *base,
            "run",
            name,
            f"--image={TEST_IMAGE}",
            "--image-pull-policy=Never",
            "--restart=Never",
            "--command",
            "--",
            "sleep",
            "3600",
        ],
        check=True,
        capture_output=True,
    )
    _wait_ready(base, name)


def _wait_ready(base: list[str], name: str) -> None:
    subprocess.run(
        [*base, "wait", "--for=condition=Ready", f"pod/{name}", "--timeout=120s"],
        check=True,
        capture_output=True,
    )


def _kubectl_shaped(base: list[str], name: str, probe_image: str) -> None:
    """The floor of corral's open: a Pod of its shape (the init container that copies
    corral's busybox, the sandbox, the probe container), no policy, created and waited
    Ready by kubectl. The init container costs the kubelet a status cycle before the
    other two start, which `kubectl run`'s one container does not pay."""
    copy = ["/bin/busybox", "cp", "/bin/busybox", "/programs/busybox"]
    mount = [{"name": "programs", "mountPath": "/programs"}]
    init = {"name": "init", "image": probe_image, "command": copy, "volumeMounts": mount}
    sandbox = {"name": "sandbox", "image": TEST_IMAGE, "command": ["sleep", "3600"]}
    beside = {"name": "probe", "image": probe_image, "command": ["sleep", "3600"]}
    for container in (init, sandbox, beside):
        container["imagePullPolicy"] = "Never"
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "initContainers": [init],
            "containers": [sandbox, beside],
            "volumes": [{"name": "programs", "emptyDir": {"sizeLimit": "64Mi"}}],
        },
    }
    subprocess.run(
        [*base, "create", "-f", "-"],
        input=json.dumps(pod).encode(),
        check=True,
        capture_output=True,
    )
    _wait_ready(base, name)


async def _rows(ctx: Context, env: KubernetesEnvironment, base: list[str]) -> list[Row]:
    plan = ExecutionPlan.model_validate({"image": TEST_IMAGE, "network": "no-network"})
    warm = await env.open(plan)  # the first Pod in a namespace waits for its service account
    await env.close(warm)
    opens: list[float] = []
    for _ in range(ctx.reps(8)):
        started = time.perf_counter()
        session = await env.open(plan)
        opens.append(time.perf_counter() - started)
        await env.close(session)
    runs: list[float] = []
    shaped: list[float] = []
    for i in range(ctx.reps(8)):
        probe_image = env.config.probe_image
        for name, times, make in (
            (f"bench-{i}", runs, functools.partial(_kubectl_run, base, f"bench-{i}")),
            (
                f"bench-shaped-{i}",
                shaped,
                functools.partial(_kubectl_shaped, base, f"bench-shaped-{i}", probe_image),
            ),
        ):
            times.append(await anyio.to_thread.run_sync(timed_sync, make))
            await anyio.run_process(
                [*base, "delete", "pod", name, "--grace-period=0", "--force"], check=False
            )
    execs: list[float] = []
    plains: list[float] = []
    kexecs: list[float] = []
    switches: list[float] = []
    enforced: list[float] = []
    async with env.session(plan) as session:
        assert isinstance(session, KubernetesSession)
        pod = session.target.pod
        executor = session.executor
        assert isinstance(executor, ChannelExecutor), "the channel is the default"
        await session.exec(["true"])  # starts the channel: copy the helper, open its websocket
        for _ in range(ctx.reps(20)):
            execs.append(await timed(lambda: session.exec(["true"])))
            plains.append(await timed(lambda: executor.plain.run(ExecRequest(("true",)))))
            kexecs.append(
                await anyio.to_thread.run_sync(
                    timed_sync,
                    lambda: subprocess.run(
                        [*base, "exec", pod, "--", "true"], check=True, capture_output=True
                    ),
                )
            )
        for _ in range(ctx.reps(10)):
            await session.set_network_policy(NetworkPolicy.public())
            switches.append(await timed(lambda: session.set_network_policy("no-network")))
            enforced.append(session.last_enforced_s)
    return [
        Row(
            "k8s: Pod open, no-network enforced",
            summarize(opens),
            "`kubectl run` + wait Ready (no policy)",
            summarize(runs),
            target=f"p50 ≤ {OPEN_TARGET}x",
            met=ratio_at_most(summarize(opens), summarize(runs), OPEN_TARGET),
            note=f"floor: a Pod of corral's shape (init container, sandbox, probe) is "
            f"{statistics.median(shaped) / statistics.median(runs):.2f}x",
        ),
        Row(
            "k8s: Pod open, no-network enforced",
            summarize(opens),
            "a Pod of corral's shape, no policy: `kubectl create` + wait Ready (the floor)",
            summarize(shaped),
        ),
        _channel_row(executor, summarize(execs), summarize(kexecs)),
        Row("k8s: exec `true` (plain)", summarize(plains), "`kubectl exec`", summarize(kexecs)),
        Row(
            "k8s: switch public → no-network (patch, probe refused)",
            summarize(switches),
            "of which patch → probe refused",
            summarize(enforced),
        ),
    ]


def _channel_row(executor: ChannelExecutor, execs: Summary, kexecs: Summary) -> Row:
    case = "k8s: exec `true` (channel)"
    if executor.starts == 0:
        return Row(case, note=f"no channel: {executor.unavailable}", met=False)
    return Row(
        case,
        execs,
        "`kubectl exec`",
        kexecs,
        target=f"p50 ≤ {CHANNEL_TARGET}x `kubectl exec`",
        met=ratio_at_most(execs, kexecs, CHANNEL_TARGET),
    )


async def _pool_rows(ctx: Context, env: KubernetesEnvironment) -> list[Row]:
    """A claim from a warm pool of one Pod against a cold open of the same plan, both timed
    with the pool full (nothing refilling meanwhile), for a baseline the probe has to see
    refused (`no-network`) and one it has nothing to dial for (`public`)."""
    cold_env = KubernetesEnvironment(env.config)  # no pool: every open is cold
    rows: list[Row] = []
    for network in ("no-network", "public"):
        plan = ExecutionPlan.model_validate({"image": TEST_IMAGE, "network": network})
        colds: list[float] = []
        claims: list[float] = []
        probes: list[float] = []
        async with env.warm_pool(plan, size_per_key=1) as pool:
            for _ in range(ctx.reps(8)):
                await pool.ready()
                started = time.perf_counter()
                cold = await cold_env.open(plan)
                colds.append(time.perf_counter() - started)
                await cold_env.close(cold)
                await pool.ready()
                started = time.perf_counter()
                claimed = await env.open(plan)
                claims.append(time.perf_counter() - started)
                assert isinstance(claimed, KubernetesSession)
                probes.append(claimed.last_enforced_s)
                await env.close(claimed)
            hits, misses = pool.hits, pool.misses
        claim_s, cold_s = summarize(claims), summarize(colds)
        what = "patch, probe refused" if network == "no-network" else "patch; nothing to probe"
        rows.append(
            Row(
                f"k8s: warm-pool claim, {network} (label, {what})",
                claim_s,
                f"corral cold open, {network}",
                cold_s,
                target=f"p50 ≤ {POOL_TARGET}x",
                met=ratio_at_most(claim_s, cold_s, POOL_TARGET),
                note=f"{hits} claims, {misses} cold; of which probe p50 "
                f"{summarize(probes).median:.2f} s",
            )
        )
    return rows
