"""The Kubernetes warm pool's pure parts: the pool key (everything the Pod is created
with, nothing a claim sets), the claim's conditional patch, its deadline, and which Pods
`corral gc` may take."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from pydantic import SecretStr

from corral.core.labels import EXPIRES_AT, OWNER, SESSION
from corral.core.plan import ExecutionPlan
from corral.network.targets import IPAddress
from corral.providers.k8s.config import KubernetesConfig
from corral.providers.k8s.pod import OPERATION_TIMEOUT
from corral.providers.k8s.pool import (
    CLAIM,
    CLAIMED,
    DEADLINE_SLACK_S,
    FILLING,
    IDLE,
    IDLE_UNTIL,
    STATE,
    claim_patch,
    claimed_deadline,
    collectable,
    pool_key,
)

IMAGE = "corral.local/test:bookworm"
BASE = ExecutionPlan.model_validate(
    {"image": IMAGE, "env": {"TOKEN": SecretStr("a"), "MODE": "x"}, "network": "no-network"}
)
CONFIG = KubernetesConfig()
DNS: tuple[IPAddress, ...] = (ipaddress.ip_address("10.96.0.10"),)


def key(
    plan: ExecutionPlan = BASE,
    cfg: KubernetesConfig = CONFIG,
    dns: tuple[IPAddress, ...] = DNS,
) -> str:
    chosen = plan.require_image("k8s")
    assert isinstance(chosen, str)
    return pool_key(plan, chosen, cfg, dns)


def plan_with(**update: Any) -> ExecutionPlan:
    return ExecutionPlan.model_validate({**BASE.model_dump(), **update})


def test_the_key_is_a_label_value_and_stable() -> None:
    found = key()
    assert len(found) == 40 and found == found.lower() and found.isalnum()
    assert key() == found


@pytest.mark.parametrize(
    "update",
    [
        {"tags": ["x"]},
        {"task_id": "t-1"},
        {"benchmark": "swe"},
        {"network": "public"},
        {"network": {"baseline": "no-network", "run": "public", "evaluation": "public"}},
        {"timeouts": {"operation_s": 5, "startup_s": 99}},
    ],
)
def test_what_a_claim_sets_or_the_pod_never_sees_is_not_in_the_key(update: dict[str, Any]) -> None:
    assert key(plan_with(**update)) == key()


@pytest.mark.parametrize(
    "update",
    [
        {"image": "other:1"},
        {"env": {"TOKEN": SecretStr("b"), "MODE": "x"}},
        {"env": {"TOKEN": SecretStr("a"), "MODE": "y"}},
        {"resources": {"cpu": 2}},
        {"resources": {"memory_mb": 512}},
        {"resources": {"placement": {"zone": "a"}}},
        {"workdir": "/srv"},
        {"command": ["sleep", "9"]},
        {"labels": {"team": "a"}},
        {"timeouts": {"max_lifetime_s": 60}},
        {"services": {"db": {"image": "db:1"}}},
    ],
)
def test_what_the_plan_decides_at_creation_is_in_the_key(update: dict[str, Any]) -> None:
    assert key(plan_with(**update)) != key()


def test_services_differ_by_everything_they_are_made_with() -> None:
    db = plan_with(services={"db": {"image": "db:1", "env": {"PASSWORD": SecretStr("p")}}})
    assert key(db) != key(plan_with(services={"db": {"image": "db:1"}}))
    other = plan_with(services={"db": {"image": "db:1", "env": {"PASSWORD": SecretStr("q")}}})
    assert key(db) != key(other)
    assert key(db) != key(plan_with(services={"db": {"image": "db:1", "command": ["x"]}}))


@pytest.mark.parametrize(
    "config",
    [
        {"runtime_class_name": "gvisor"},
        {"run_as_user": 1000},
        {"security_context": {"runAsNonRoot": True, "runAsUser": 1000}},
        {"unsafe_capabilities": ["SYS_PTRACE"]},
        {"probe_image": "probe:2"},
        {"image_pull_policy": "Always"},
        {"node_selector": {"pool": "gpu"}},
        {"tolerations": [{"key": "gpu", "operator": "Exists"}]},
        {"cpu_limit": "2"},
        {"memory_request": "1Gi"},
        {"service_account": "runner"},
        {"annotations": {"team": "a"}},
        {"labels": {"team": "a"}},
        {"host_aliases": {"api.example": "10.0.0.1"}},
        {"default_lifetime_s": 60},
    ],
)
def test_what_the_config_decides_at_creation_is_in_the_key(config: dict[str, Any]) -> None:
    assert key(cfg=KubernetesConfig.model_validate(config)) != key()


def test_the_pods_resolvers_are_in_the_key() -> None:
    assert key(dns=()) != key()
    assert key(dns=(ipaddress.ip_address("10.96.0.11"),)) != key()


def test_the_claim_is_conditional_and_sets_what_the_session_needs() -> None:
    patch = claim_patch("42", "tok", expires_at=1000, active_deadline_s=70, operation_s=5.0)
    assert patch["metadata"]["resourceVersion"] == "42"
    labels = patch["metadata"]["labels"]
    assert labels == {STATE: CLAIMED, IDLE_UNTIL: None, EXPIRES_AT: "1000"}
    assert patch["metadata"]["annotations"] == {CLAIM: "tok", OPERATION_TIMEOUT: "5.0"}
    assert patch["spec"] == {"activeDeadlineSeconds": 70}
    unset = claim_patch("42", "tok", expires_at=1000, active_deadline_s=70, operation_s=None)
    assert unset["metadata"]["annotations"][OPERATION_TIMEOUT] is None  # removed


def test_a_claimed_deadline_is_age_plus_lifetime_and_never_grows() -> None:
    assert claimed_deadline(100.0, 130.0, 60.0, 1000) == 90 + DEADLINE_SLACK_S
    assert claimed_deadline(100.0, 130.0, 60.0, 50) == 50  # the API server refuses more
    assert claimed_deadline(200.0, 130.0, 60.0, 1000) == 60 + DEADLINE_SLACK_S  # clock skew
    assert claimed_deadline(None, 130.0, 60.0, None) == 60 + DEADLINE_SLACK_S


@pytest.mark.parametrize(
    ("labels", "now", "expected"),
    [
        ({OWNER: "me", SESSION: "abc123", STATE: IDLE, IDLE_UNTIL: "100"}, 100, True),
        ({OWNER: "me", SESSION: "abc123", STATE: FILLING, IDLE_UNTIL: "100"}, 101, True),
        ({OWNER: "me", SESSION: "abc123", STATE: IDLE, IDLE_UNTIL: "100"}, 99, False),
        ({OWNER: "me", SESSION: "abc123", STATE: CLAIMED, IDLE_UNTIL: "100"}, 200, False),
        ({OWNER: "me", SESSION: "abc123", STATE: CLAIMED}, 200, False),
        ({OWNER: "you", SESSION: "abc123", STATE: IDLE, IDLE_UNTIL: "100"}, 200, False),
        ({OWNER: "me", SESSION: "../x", STATE: IDLE, IDLE_UNTIL: "100"}, 200, False),
        ({OWNER: "me", SESSION: "abc123", STATE: IDLE, IDLE_UNTIL: "soon"}, 200, False),
        ({OWNER: "me", SESSION: "abc123", IDLE_UNTIL: "100"}, 200, False),
    ],
)
def test_gc_takes_only_the_owners_unclaimed_pods_past_their_idle_age(
    labels: dict[str, str], now: float, expected: bool
) -> None:
    assert collectable(labels, "me", now) is expected


def test_pool_defaults_are_in_the_config() -> None:
    cfg = KubernetesConfig.model_validate({"warm_pool_size": 3, "warm_pool_max_idle_s": 30})
    assert (cfg.warm_pool_size, cfg.warm_pool_max_idle_s) == (3, 30)
    assert (CONFIG.warm_pool_size, CONFIG.warm_pool_max_idle_s) == (2, 600)
    with pytest.raises(ValueError, match="warm_pool_size"):
        KubernetesConfig.model_validate({"warm_pool_size": 0})
