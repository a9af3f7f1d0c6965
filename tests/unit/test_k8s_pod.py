"""The sandbox Pod's manifest: corral's probe container beside the workload, names the
harness owns, resolvers corral chose."""

from __future__ import annotations

import ipaddress
import json
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client import ApiClient
from pydantic import ValidationError

from corral.core.plan import ExecutionPlan, ServiceSpec
from corral.errors import ConfigError, ProviderError
from corral.providers.k8s.config import KubernetesConfig
from corral.providers.k8s.pod import (
    INIT_CONTAINER,
    KUBELET_FLAG,
    SERVICES,
    _settled,  # pyright: ignore[reportPrivateUsage]
    check_services,
    fatal,
    manifest,
    running,
    services,
)


def _spec(dns: tuple[str, ...] = (), **config: Any) -> dict[str, Any]:
    cfg = KubernetesConfig.model_validate(config)
    servers = tuple(ipaddress.ip_address(s) for s in dns)
    pod = manifest("corral-x", "img:1", ExecutionPlan(image="img:1"), cfg, {}, servers)
    return pod["spec"]


def test_the_probe_container_shares_only_the_network() -> None:
    spec = _spec(probe_image="probe:1")
    sandbox, prober = spec["containers"]
    assert (sandbox["name"], prober["name"], prober["image"]) == (
        "sandbox",
        "corral-probe",
        "probe:1",
    )
    security = prober["securityContext"]
    assert security["runAsNonRoot"] and security["readOnlyRootFilesystem"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "shareProcessNamespace" not in spec
    # Its one volume is corral's programs (read-only in the sandbox), nothing of the node.
    assert prober["volumeMounts"] == [{"name": "corral-programs", "mountPath": "/corral"}]
    assert sandbox["volumeMounts"] == [
        {"name": "corral-programs", "mountPath": "/.corral", "readOnly": True},
        {"name": "corral-shm", "mountPath": "/dev/shm"},
    ]
    assert spec["volumes"] == [
        {"name": "corral-programs", "emptyDir": {"sizeLimit": "64Mi"}},
        {"name": "corral-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
    ]
    (init,) = spec["initContainers"]
    assert init["image"] == "probe:1" and init["securityContext"] == security


def test_ipv6_is_off_in_the_pod_and_sysv_shm_goes_with_its_creator() -> None:
    """kube-router (and many CNIs) police IPv4 only: the Pod must not have IPv6 at all."""
    sysctls = {s["name"]: s["value"] for s in _spec()["securityContext"]["sysctls"]}
    assert sysctls == {
        "net.ipv6.conf.all.disable_ipv6": "1",
        "net.ipv6.conf.default.disable_ipv6": "1",
        "kernel.shm_rmid_forced": "1",
    }
    kept = _spec(disable_ipv6=False)["securityContext"]["sysctls"]
    assert kept == [{"name": "kernel.shm_rmid_forced", "value": "1"}]
    assert KubernetesConfig(disable_ipv6=False).opt_ins() == {"disable_ipv6": "false"}


def test_only_the_sandbox_has_its_own_dev_shm() -> None:
    plan = ExecutionPlan(image="img:1", services={"db": ServiceSpec(image="db:1")})
    spec = manifest("corral-x", "img:1", plan, KubernetesConfig(), {}, ())["spec"]
    mounts = {c["name"]: c.get("volumeMounts", []) for c in spec["containers"]}
    shm = {"name": "corral-shm", "mountPath": "/dev/shm"}
    assert shm in mounts["sandbox"]
    assert all(shm not in m for name, m in mounts.items() if name != "sandbox")


def test_a_kubelet_refusing_the_ipv6_sysctls_is_one_line_naming_its_flag() -> None:
    refused = SimpleNamespace(
        spec=SimpleNamespace(init_containers=[], containers=[]),
        status=SimpleNamespace(
            conditions=[],
            init_container_statuses=None,
            container_statuses=None,
            phase="Failed",
            reason="SysctlForbidden",
            message='Pod forbidden sysctl: "net.ipv6.conf.all.disable_ipv6" not allowlisted',
        ),
    )
    cause = fatal(refused)
    assert cause is not None and "\n" not in cause
    assert KUBELET_FLAG in cause and "disable_ipv6=False" in cause
    assert KUBELET_FLAG == (
        "--allowed-unsafe-sysctls=net.ipv6.conf.all.disable_ipv6,net.ipv6.conf.default.disable_ipv6"
    )


def test_names_and_resolvers_come_from_the_config() -> None:
    spec = _spec(("10.96.0.10",), host_aliases={"A.Example.": "10.0.0.1", "b.example": "10.0.0.1"})
    assert spec["hostAliases"] == [{"ip": "10.0.0.1", "hostnames": ["a.example", "b.example"]}]
    assert (spec["dnsPolicy"], spec["dnsConfig"]) == ("None", {"nameservers": ["10.96.0.10"]})
    assert "dnsPolicy" not in _spec()


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"host_aliases": {"api.example": "api.other"}}, "api.other"),
        ({"host_aliases": {"10.0.0.1": "10.0.0.2"}}, "10.0.0.1"),
        ({"dns_servers": ["10.0.0.1", "resolver.example"]}, "resolver.example"),
        ({"dns_servers": ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]}, "more than the 3"),
    ],
)
def test_bad_names_config_is_refused_naming_the_value(config: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        KubernetesConfig.model_validate(config)


WEB = {
    "image": "web:1",
    "command": ["python3", "-m", "http.server", "8080"],
    "env": {"MODE": "test", "API_TOKEN": "hunter2-secret"},
    "resources": {"cpu": 0.5, "memory_mb": 256},
    "workdir": "/srv",
}


def _with_services(services: dict[str, Any], **config: Any) -> dict[str, Any]:
    cfg = KubernetesConfig.model_validate(config)
    plan = ExecutionPlan(image="img:1", services=services)
    return manifest("corral-x", "img:1", plan, cfg, {}, ())


def test_services_are_containers_of_the_pod_confined_as_the_sandbox() -> None:
    pod = _with_services({"web": WEB, "db": {"image": "db:1"}}, run_as_user=1000)
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    assert list(containers) == ["sandbox", "corral-probe", "svc-web", "svc-db"]
    sandbox, web, db = containers["sandbox"], containers["svc-web"], containers["svc-db"]
    assert web["securityContext"] == db["securityContext"] == sandbox["securityContext"]
    assert web["securityContext"]["runAsUser"] == 1000
    assert web["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert (web["image"], web["command"], web["workingDir"]) == (
        "web:1",
        ["python3", "-m", "http.server", "8080"],
        "/srv",
    )
    assert web["env"] == [
        {"name": "MODE", "value": "test"},
        {"name": "API_TOKEN", "value": "hunter2-secret"},
    ]
    assert web["resources"] == {"limits": {"cpu": "500m", "memory": "256Mi"}}
    # No command: the image's own entrypoint, not corral's gate; no workdir: the image's.
    assert "command" not in db and "workingDir" not in db and "args" not in db
    # One Pod, one network namespace: nothing a service could get on its own.
    assert "shareProcessNamespace" not in pod["spec"] and "hostNetwork" not in pod["spec"]
    assert "volumeMounts" not in web


def test_the_services_annotation_names_them_and_holds_no_secret() -> None:
    pod = _with_services({"web": WEB, "db": {"image": "db:1"}})
    annotations = pod["metadata"]["annotations"]
    assert annotations[SERVICES] == "web,db"
    assert "hunter2-secret" not in repr(annotations)
    assert SERVICES not in _with_services({})["metadata"]["annotations"]


@pytest.mark.parametrize("name", ["sandbox", "corral-probe", "corral-reaper-0a1b2c3d"])
def test_a_service_named_like_corrals_containers_does_not_collide(name: str) -> None:
    pod = _with_services({name: {"image": "db:1"}})
    names = [c["name"] for c in pod["spec"]["containers"]]
    assert names == ["sandbox", "corral-probe", f"svc-{name}"]
    assert all(len(n) <= 63 for n in names)


def test_a_service_placement_is_refused_naming_it() -> None:
    db = {"image": "db:1", "resources": {"placement": {"a": "b"}}}
    plan = ExecutionPlan.model_validate({"image": "img:1", "services": {"db": db}})
    with pytest.raises(ConfigError, match="'db'.*placement"):
        check_services(plan)


def _pod(annotations: dict[str, str], containers: list[str]) -> Any:
    return SimpleNamespace(
        metadata=SimpleNamespace(name="corral-x", annotations=annotations),
        spec=SimpleNamespace(
            containers=[SimpleNamespace(name=n, working_dir=None) for n in containers]
        ),
    )


def test_services_of_a_pod_are_those_its_open_annotated() -> None:
    found = services(_pod({SERVICES: "web"}, ["sandbox", "corral-probe", "svc-web", "svc-x"]))
    assert list(found) == ["web"], "a container corral did not annotate is no service"
    assert services(_pod({}, ["sandbox", "corral-probe"])) == {}
    with pytest.raises(ProviderError, match="'db'.*svc-db"):
        services(_pod({SERVICES: "web,db"}, ["sandbox", "svc-web"]))


def test_a_service_that_fails_to_start_is_named() -> None:
    def status(name: str, **state: Any) -> Any:
        full = {"waiting": None, "terminated": None, "running": None, **state}
        return SimpleNamespace(name=name, image="x", state=SimpleNamespace(**full))

    def pod(*statuses: Any, init: tuple[Any, ...] = ()) -> Any:
        return SimpleNamespace(
            spec=SimpleNamespace(
                init_containers=[SimpleNamespace(name="corral-programs", image="probe:1")],
                containers=[SimpleNamespace(name="svc-db", image="db:1")],
            ),
            status=SimpleNamespace(
                conditions=[],
                init_container_statuses=list(init),
                container_statuses=list(statuses),
                phase="Pending",
            ),
        )

    pulling = SimpleNamespace(reason="ErrImageNeverPull", message="not present")
    assert fatal(pod(status("svc-db", waiting=pulling))) == (
        "service 'db': ErrImageNeverPull for image 'db:1': not present"
    )
    ended = SimpleNamespace(exit_code=3, reason="Error")
    cause = fatal(pod(status("svc-db", terminated=ended)))
    assert cause is not None and cause.startswith("service 'db': container svc-db exited with")
    assert "must keep running" in cause
    done = SimpleNamespace(exit_code=0, reason="Completed")
    assert fatal(pod(init=(status("corral-programs", terminated=done),))) is None
    failed = fatal(pod(init=(status("corral-programs", terminated=ended),)))
    assert failed is not None and "probe_image must hold /bin/busybox" in failed


def _pod_json(phase: str, inits: list[Any], statuses: list[Any], **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "corral-x"},
        "spec": {
            "initContainers": [{"name": INIT_CONTAINER, "image": "corral.local/holder"}],
            "containers": [
                {"name": "sandbox", "image": "img:1"},
                {"name": "corral-probe", "image": "corral.local/holder"},
            ],
        },
        "status": {
            "phase": phase,
            "initContainerStatuses": inits,
            "containerStatuses": statuses,
            **status,
        },
    }


def _status(name: str, state: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "image": "img:1", "imageID": "", "ready": False, "restartCount": 0,
            "state": state}  # fmt: skip


_RUN: dict[str, Any] = {"running": {}}
_MAKING = {"waiting": {"reason": "ContainerCreating"}}
_NEVER_PULLED = {"waiting": {"reason": "ErrImageNeverPull"}}
_INIT_DONE = _status(INIT_CONTAINER, {"terminated": {"exitCode": 0, "reason": "Completed"}})
_POD_STATES: dict[str, tuple[dict[str, Any], bool]] = {
    "pending, nothing yet": (_pod_json("Pending", [], []), False),
    "the init container runs": (
        _pod_json("Pending", [_status(INIT_CONTAINER, _RUN)], []),
        False,
    ),
    "the containers are being made": (
        _pod_json("Pending", [_INIT_DONE], [_status("sandbox", _MAKING)] * 2),
        False,
    ),
    "all run": (
        _pod_json(
            "Running", [_INIT_DONE], [_status("sandbox", _RUN), _status("corral-probe", _RUN)]
        ),
        True,
    ),
    "one of two runs": (
        _pod_json("Running", [_INIT_DONE], [_status("sandbox", _RUN), _status("x", _MAKING)]),
        False,
    ),
    "the image is never pulled": (
        _pod_json(
            "Pending",
            [_INIT_DONE],
            [_status("sandbox", {"waiting": {"reason": "ErrImageNeverPull"}})],
        ),
        True,
    ),
    "the init container failed": (
        _pod_json("Pending", [_status(INIT_CONTAINER, {"terminated": {"exitCode": 1}})], []),
        True,
    ),
    "the sandbox exited": (
        _pod_json("Running", [_INIT_DONE], [_status("sandbox", {"terminated": {"exitCode": 0}})]),
        True,
    ),
    "unschedulable": (
        _pod_json(
            "Pending",
            [],
            [],
            conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        ),
        True,
    ),
    "failed": (_pod_json("Failed", [], []), True),
}


@pytest.mark.parametrize("state", list(_POD_STATES))
def test_a_pod_read_as_json_is_decoded_exactly_when_it_runs_or_may_have_failed(state: str) -> None:
    """The open's poll decodes the Pod (milliseconds of the GIL) only when `running` or
    `fatal` can say something: never on the way there, always when either would."""
    raw, settles = _POD_STATES[state]
    client: Any = ApiClient()
    decoded: Any = client.deserialize(json.dumps(raw), "V1Pod", "application/json")
    assert _settled(raw) is settles
    assert settles is (running(decoded) or fatal(decoded) is not None)
