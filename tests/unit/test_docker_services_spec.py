"""The Docker service container's spec, and the warm pool's key, without an engine."""

from __future__ import annotations

from pydantic import SecretStr

from corral.core.plan import ExecutionPlan, Resources, ServiceSpec
from corral.providers.docker.config import DockerConfig
from corral.providers.docker.pool import pool_key
from corral.providers.docker.services import (
    SERVICES,
    resource_limits,
    service_container,
    service_names,
)

SECRET = "hunter2-service-secret"
LABELS = {"corral.owner": "o", "corral.session": "s-1", "corral.expires-at": "9"}


def spec(**fields: object) -> ServiceSpec:
    return ServiceSpec.model_validate({"image": "corral.local/test:bookworm", **fields})


def test_a_service_is_hardened_like_the_sandbox_in_the_holders_namespace() -> None:
    cfg = DockerConfig(
        unsafe_capabilities=("SYS_PTRACE",),
        mounts=("/tmp/x:/x",),
        runtime="runc",
        pids_limit=99,
    )
    made = service_container("s-1", "db", spec(command=["run"]), "holder-id", LABELS, cfg)
    host = made.host
    assert made.name == "corral-s-1-svc-db"
    assert host["network_mode"] == "container:holder-id"
    assert host["cap_drop"] == ["ALL"]
    assert set(host["cap_add"]) == set(cfg.capabilities)
    assert not {"NET_ADMIN", "NET_RAW", "SYS_PTRACE"} & set(host["cap_add"])
    assert host["security_opt"] == ["no-new-privileges"]
    assert (host["runtime"], host["pids_limit"], host["init"]) == ("runc", 99, True)
    assert "binds" not in host and "auto_remove" not in host
    assert made.labels == {**LABELS, "corral.role": "service", "corral.service": "db"}
    assert made.command == ["run"]


def test_resources_map_as_the_sandboxs_do() -> None:
    cfg = DockerConfig(default_cpu=0.5, default_memory_mb=256)
    defaults = service_container("s", "a", spec(), "h", LABELS, cfg).host
    assert (defaults["nano_cpus"], defaults["mem_limit"]) == (500_000_000, "256m")
    own = spec(resources=Resources(cpu=2, memory_mb=1024, disk_mb=100))
    host = service_container("s", "a", own, "h", LABELS, cfg).host
    assert host == {**host, **resource_limits(own.resources, cfg)}
    assert (host["nano_cpus"], host["mem_limit"], host["storage_opt"]) == (
        2_000_000_000,
        "1024m",
        {"size": "100M"},
    )


def test_the_spec_passes_secrets_to_the_engine_and_never_shows_them() -> None:
    service = spec(env={"DB_PASSWORD": SECRET, "MODE": "x"}, workdir="/srv")
    made = service_container("s", "db", service, "h", LABELS, DockerConfig())
    assert made.environment == {"DB_PASSWORD": SECRET, "MODE": "x"}
    assert made.working_dir == "/srv"
    assert SECRET not in repr(made) and SECRET not in str(made)


def test_the_session_labels_name_its_services() -> None:
    assert service_names({**LABELS, SERVICES: "web,db"}) == ("web", "db")
    assert service_names(LABELS) == ()


def test_a_plan_takes_only_a_pooled_sandbox_made_with_its_services() -> None:
    bare = ExecutionPlan(image="i")
    web = bare.model_copy(update={"services": {"web": spec()}})
    other_env = bare.model_copy(update={"services": {"web": spec(env={"TOKEN": SecretStr("b")})}})
    same_env = bare.model_copy(update={"services": {"web": spec(env={"TOKEN": SecretStr("b")})}})
    keys = {pool_key(bare), pool_key(web), pool_key(other_env)}
    assert len(keys) == 3
    assert pool_key(other_env) == pool_key(same_env)
