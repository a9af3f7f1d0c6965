"""Provider settings that would hand the sandbox the host: refused, or opted into by name.

Capabilities and mounts are judged against allowlists; whatever defeats the boundary
needs an `unsafe_*` field, which every open logs at warning level.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral import ExecutionPlan, ProviderError
from corral.core.privileges import SAFE_CAPABILITIES
from corral.providers.docker import DockerConfig, DockerEnvironment
from corral.providers.k8s import KubernetesConfig, KubernetesEnvironment
from corral.providers.k8s.pod import manifest

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    "cap", ["SYS_MODULE", "DAC_READ_SEARCH", "SYS_PTRACE", "BPF", "cap_sys_rawio", "PERFMON"]
)
def test_capabilities_outside_the_safe_set_need_an_opt_in(cap: str) -> None:
    with pytest.raises(ValueError, match=rf"{cap.upper().removeprefix('CAP_')}: outside"):
        DockerConfig(capabilities=(cap,))
    with pytest.raises(ValueError, match=r"outside the safe set"):
        KubernetesConfig.model_validate({"security_context": {"capabilities": {"add": [cap]}}})
    docker = DockerConfig(unsafe_capabilities=(cap,))
    assert docker.opt_ins() == {"unsafe_capabilities": cap.upper().removeprefix("CAP_")}
    k8s = KubernetesConfig(unsafe_capabilities=(cap,))
    body = manifest("n", "img", ExecutionPlan(image="img"), k8s, {}, ())
    added = body["spec"]["containers"][0]["securityContext"]["capabilities"]["add"]
    assert added[-1] == cap.upper().removeprefix("CAP_")


@pytest.mark.parametrize("cap", ["NET_ADMIN", "NET_RAW", "CAP_NET_RAW", "SYS_ADMIN", "ALL"])
def test_network_capabilities_are_never_granted_even_with_an_opt_in(cap: str) -> None:
    for params in ({"capabilities": (cap,)}, {"unsafe_capabilities": (cap,)}):
        with pytest.raises(ValueError, match="never granted"):
            DockerConfig.model_validate(params)
    k8s_params = (
        {"unsafe_capabilities": (cap,)},
        {"security_context": {"capabilities": {"add": [cap]}}},
    )
    for params in k8s_params:
        with pytest.raises(ValueError, match="never granted"):
            KubernetesConfig.model_validate(params)


def test_capability_names_are_checked() -> None:
    with pytest.raises(ValueError, match="SYS_MODUL: not a Linux capability"):
        DockerConfig(unsafe_capabilities=("SYS_MODUL",))
    with pytest.raises(ValueError, match="CHOWN: in the safe set"):
        DockerConfig(unsafe_capabilities=("CHOWN",))
    assert DockerConfig(capabilities=("cap_chown", "KILL")).capabilities == ("CHOWN", "KILL")
    assert DockerConfig().capabilities == SAFE_CAPABILITIES
    assert DockerConfig().opt_ins() == {}


@pytest.fixture
def host_socket(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "engine.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    yield path
    server.close()


@pytest.mark.parametrize(
    ("mount", "reason"),
    [
        ("/:/host", "/ holds /proc"),
        ("/var/run/docker.sock:/var/run/docker.sock", "/var/run"),
        ("/run/docker.sock:/s", "/run"),
        ("/run/containerd/containerd.sock:/s", "/run"),
        ("/var/lib/docker:/d:ro", "/var/lib/docker is in /var/lib/docker"),
        ("/var:/v", "/var holds /var/run"),
        ("/var/lib:/v:ro", "/var/lib holds /var/lib/docker"),
        ("/proc:/p", "/proc"),
        ("/proc/1/root:/p", "/proc/1/root is in /proc"),
        ("/sys:/s:ro", "/sys"),
        ("/dev/sda:/d", "/dev/sda is in /dev"),
        ("/etc:/e:ro", "/etc"),
        ("//etc/../etc/shadow:/e:ro", "/etc/shadow is in /etc"),
        ("/boot:/b", "/boot"),
        ("/root/.ssh:/k", "/root/.ssh is in /root"),
        ("/usr:/u", "bind it with :ro"),
        ("/usr/local/bin:/u:rw", "bind it with :ro"),
        ("/lib64:/l", "bind it with :ro"),
    ],
)
def test_mounts_that_expose_the_host_need_an_opt_in(mount: str, reason: str) -> None:
    with pytest.raises(ValueError, match=re.escape(mount) + ".*" + re.escape(reason)):
        DockerConfig(mounts=(mount,))
    opted = DockerConfig(unsafe_mounts=(mount,))
    assert opted.opt_ins() == {"unsafe_mounts": mount}


def test_sockets_and_links_are_judged_where_they_lead(tmp_path: Path, host_socket: Path) -> None:
    with pytest.raises(ValueError, match="is a socket"):
        DockerConfig(mounts=(f"{host_socket}:/s",))
    link = tmp_path / "innocent"
    link.symlink_to("/")
    with pytest.raises(ValueError, match=r"innocent.*/ holds /proc"):
        DockerConfig(mounts=(f"{link}:/w",))
    assert DockerConfig(unsafe_mounts=(f"{host_socket}:/s",)).unsafe_mounts


def test_ordinary_mounts_are_fine(tmp_path: Path) -> None:
    mounts = (f"{tmp_path}:/workspace", "/usr/share/zoneinfo:/z:ro", "cache-vol:/cache:rw")
    assert DockerConfig(mounts=mounts).mounts == mounts
    with pytest.raises(ValueError, match="is safe"):
        DockerConfig(unsafe_mounts=(f"{tmp_path}:/w",))


@pytest.mark.parametrize(
    ("mount", "message"),
    [
        ("/a/b/c", r"host:container\[:ro\|rw\]"),
        ("/tmp:/d:z", r"host:container\[:ro\|rw\]"),
        ("/tmp:/d:shared", r"host:container\[:ro\|rw\]"),
        ("rel/dir:/d", "neither an absolute path nor a volume"),
        ("/tmp:relative", "container path must be absolute"),
    ],
)
def test_malformed_mounts_name_the_mount(mount: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(mount)) + ".*" + message):
        DockerConfig(mounts=(mount,))


@pytest.mark.parametrize(
    ("context", "named"),
    [
        ({"privileged": True}, "privileged"),
        ({"allowPrivilegeEscalation": True}, "allowPrivilegeEscalation"),
        ({"procMount": "Unmasked"}, "Unmasked"),
        ({"seLinuxOptions": {"type": "spc_t"}}, "spc_t"),
        ({"windowsOptions": {"hostProcess": True}}, "windowsOptions"),
        ({"seccompProfile": {"type": "Unconfined"}}, "Unconfined"),
        ({"appArmorProfile": {"type": "Unconfined"}}, "Unconfined"),
        ({"capabilities": {"drop": ["NET_RAW"]}}, "must include ALL"),
        ({"capabilities": {"add": ["SYS_MODULE"]}}, "SYS_MODULE"),
        ({"capabilities": {"add": ["NET_ADMIN"]}}, "NET_ADMIN"),
        ({"runAsUser": -1}, "runAsUser"),
        ({"sysctls": []}, "sysctls"),
    ],
)
def test_security_context_outside_the_allowlist_is_refused(
    context: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match=named):
        KubernetesConfig.model_validate({"security_context": context})


def test_security_context_allowlist_reaches_the_pod() -> None:
    cfg = KubernetesConfig.model_validate(
        {
            "security_context": {
                "runAsUser": 1000,
                "runAsGroup": 1000,
                "runAsNonRoot": True,
                "readOnlyRootFilesystem": True,
                "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
                "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"},
                "appArmorProfile": {"type": "RuntimeDefault"},
                "seLinuxOptions": {"type": "container_t", "level": "s0:c1,c2"},
            }
        }
    )
    context = manifest("n", "img", ExecutionPlan(image="img"), cfg, {}, ())["spec"]["containers"][
        0
    ]["securityContext"]
    assert context == {
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
        "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"},
        "appArmorProfile": {"type": "RuntimeDefault"},
        "seLinuxOptions": {"type": "container_t", "level": "s0:c1,c2"},
    }


def test_the_pod_never_shares_the_node_and_mounts_no_token_by_default() -> None:
    cfg = KubernetesConfig(service_account="builder")
    spec = manifest("n", "img", ExecutionPlan(image="img"), cfg, {}, ())["spec"]
    assert spec["automountServiceAccountToken"] is False
    host = {"hostNetwork", "hostPID", "hostIPC", "hostUsers"}
    assert host.isdisjoint(spec)
    # The Pod-level context sets namespaced sysctls only (IPv6 off, SysV shm reclaimed).
    assert set(spec["securityContext"]) == {"sysctls"}
    # corral's programs and the sandbox's /dev/shm, emptyDirs: nothing of the node's.
    assert spec["volumes"] == [
        {"name": "corral-programs", "emptyDir": {"sizeLimit": "64Mi"}},
        {"name": "corral-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
    ]
    assert set(spec["containers"][0]) == {
        "name",
        "image",
        "imagePullPolicy",
        "command",
        "env",
        "securityContext",
        "resources",
        "volumeMounts",
    }
    token = KubernetesConfig(service_account="builder", unsafe_service_account_token=True)
    assert manifest("n", "img", ExecutionPlan(image="img"), token, {}, ())["spec"][
        "automountServiceAccountToken"
    ]
    assert token.opt_ins() == {"unsafe_service_account_token": "True"}


@pytest.mark.parametrize(
    "key",
    [
        "container.apparmor.security.beta.kubernetes.io/sandbox",
        "seccomp.security.alpha.kubernetes.io/pod",
    ],
)
def test_confinement_annotations_are_refused(key: str) -> None:
    with pytest.raises(ValueError, match=re.escape(key)):
        KubernetesConfig(annotations={key: "unconfined"})


async def test_opt_ins_are_logged_at_every_open(caplog: pytest.LogCaptureFixture) -> None:
    # Neither engine exists: the warning comes before any engine call, at each attempt.
    docker = DockerEnvironment(
        base_url="unix:///nonexistent/corral.sock",
        unsafe_capabilities=("SYS_PTRACE",),
        unsafe_mounts=("/var/run/docker.sock:/var/run/docker.sock",),
    )
    k8s = KubernetesEnvironment(kubeconfig="/nonexistent/kubeconfig", verify_policy="off")
    plan = ExecutionPlan(image="img")
    with caplog.at_level("WARNING", logger="corral.environment"):
        for env in (docker, docker, k8s):
            with pytest.raises(ProviderError):
                await env.open(plan)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    unsafe = [m for m in warnings if m.startswith("unsafe configuration in force")]
    assert unsafe == [
        "unsafe configuration in force provider=docker unsafe_capabilities=SYS_PTRACE "
        "unsafe_mounts=/var/run/docker.sock:/var/run/docker.sock",
    ] * 2 + ["unsafe configuration in force provider=k8s verify_policy=off"]
