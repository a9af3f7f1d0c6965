"""The provider-independent parts of services: the plan's model, `service=` checks, the
healthcheck wait. The providers' own tests run real containers (Docker) and Pods (k8s)."""

from __future__ import annotations

import pytest
from pydantic import SecretStr, ValidationError

from corral.core.plan import ExecutionPlan, Healthcheck, ServiceSpec
from corral.core.services import wait_healthy
from corral.core.session import ExecRequest, ExecResult
from corral.errors import ConfigError, FeatureUnsupported, ProviderError
from corral.providers.local.environment import LocalEnvironment
from tests.unit.fakes import FakeEnvironment, FakeSession

pytestmark = pytest.mark.anyio


def test_service_names_are_dns_labels() -> None:
    ExecutionPlan(services={"db": ServiceSpec(image="postgres"), "web-1": {"image": "x"}})  # pyright: ignore[reportArgumentType]
    for bad in ("DB", "-db", "db-", "a" * 33, "", "d_b", "db/x"):
        with pytest.raises(ValidationError, match="service name"):
            ExecutionPlan(services={bad: ServiceSpec(image="x")})


def test_service_env_secrets_are_masked_everywhere() -> None:
    plan = ExecutionPlan(
        services={"db": {"image": "postgres", "env": {"POSTGRES_PASSWORD": "hunter2-pw"}}}  # pyright: ignore[reportArgumentType]
    )
    value = plan.services["db"].env["POSTGRES_PASSWORD"]
    assert isinstance(value, SecretStr)
    assert "hunter2-pw" not in repr(plan)
    assert "hunter2-pw" not in str(plan.persisted())
    with pytest.raises(ValidationError) as caught:
        ExecutionPlan(services={"db": {"image": "a b", "env": {"DB_TOKEN": "hunter2-tk"}}})  # pyright: ignore[reportArgumentType]
    assert "hunter2-tk" not in str(caught.value)
    assert "'a b'" in str(caught.value)


def test_bad_service_fields_name_the_value() -> None:
    with pytest.raises(ValidationError, match="'rel/dir'"):
        ServiceSpec(image="x", workdir="rel/dir")
    with pytest.raises(ValidationError, match="non-empty command"):
        Healthcheck(test=[])
    with pytest.raises(ValidationError, match="extra"):
        ServiceSpec.model_validate({"image": "x", "ports": ["80:80"]})


def test_a_provider_without_services_refuses_a_plan_with_them() -> None:
    plan = ExecutionPlan(services={"db": ServiceSpec(image="x")})
    with pytest.raises(FeatureUnsupported, match="'local'.*services.*db"):
        LocalEnvironment().prepare(plan)


async def test_service_argument_is_checked_against_the_plan() -> None:
    session = FakeSession(FakeEnvironment(), ExecutionPlan().network.baseline)
    session.environment = FakeEnvironment()
    session.services = ("db",)
    await session.exec("true", service="db")
    assert session.requests[-1].service == "db"
    await session.exec("true")
    assert session.requests[-1].service is None
    with pytest.raises(FeatureUnsupported, match="'fake' has no services.*'web'"):
        await session.exec("true", service="web")
    type(session.environment).supports_services = True
    try:
        with pytest.raises(ConfigError, match="no service 'web' \\(services: db\\)"):
            await session.exec("true", service="web")
        with pytest.raises(ConfigError, match="no service 'db '"):
            session.service_name("db ")
    finally:
        type(session.environment).supports_services = False


class ScriptedSession(FakeSession):
    """Answers healthchecks from a script of (service, exit code) outcomes."""

    def __init__(self, outcomes: dict[str, list[int]]) -> None:
        env = FakeEnvironment()
        super().__init__(env, ExecutionPlan().network.baseline)
        self.environment = env
        self.services = tuple(outcomes)
        self.outcomes = outcomes

    async def _exec(self, request: ExecRequest) -> ExecResult:
        self.requests.append(request)
        assert request.service is not None
        code = self.outcomes[request.service].pop(0)
        return ExecResult(returncode=code, stdout="", stderr="not yet pw=s3cr3t", duration_s=0)


async def test_wait_healthy_retries_until_each_service_passes() -> None:
    check = Healthcheck(test="pg_isready", interval_s=0.01, retries=5)
    session = ScriptedSession({"db": [1, 1, 0], "web": [0], "plain": []})
    await wait_healthy(
        session,
        {
            "db": ServiceSpec(image="x", healthcheck=check),
            "web": ServiceSpec(image="y", healthcheck=check),
            "plain": ServiceSpec(image="z"),
        },
    )
    ran = [r.service for r in session.requests]
    assert ran.count("db") == 3 and ran.count("web") == 1 and "plain" not in ran
    assert session.requests[0].args == ("sh", "-c", "pg_isready")
    assert session.requests[0].timeout == check.timeout_s


async def test_wait_healthy_names_the_service_and_masks_its_secrets() -> None:
    check = Healthcheck(test=["false"], interval_s=0.01, retries=2)
    session = ScriptedSession({"db": [3, 3]})
    spec = ServiceSpec(image="x", healthcheck=check, env={"DB_PASSWORD": "s3cr3t"})
    with pytest.raises(ProviderError) as caught:
        await wait_healthy(session, {"db": spec})
    message = str(caught.value)
    assert "'db'" in message and "2 healthcheck attempts" in message and "exited 3" in message
    assert "s3cr3t" not in message
