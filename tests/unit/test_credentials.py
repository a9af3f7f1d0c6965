"""Credential routes as a plan holds them (secrets never shown, names and URLs checked),
and the proxy's redactor (a value split across any two pieces is still struck out, and
nothing else is held back). The proxy itself runs against a real engine and upstream in
tests/integration/docker/test_docker_credentials.py."""

from __future__ import annotations

import json

import pytest
from pydantic import SecretStr

from corral import ExecutionPlan, FeatureUnsupported
from corral.core.credentials import CredentialRoute
from corral.core.credproxy import REDACTED, Redactor
from corral.providers.local import LocalEnvironment

KEY = "sk-unit-0123456789abcdef"


def _route(**fields: object) -> CredentialRoute:
    return CredentialRoute.model_validate(
        {"upstream": "https://api.example.com/v1", "headers": {"Authorization": KEY}, **fields}
    )


def test_a_route_never_shows_its_headers() -> None:
    plan = ExecutionPlan(credentials={"model": _route()})
    assert KEY not in repr(plan) and KEY not in json.dumps(plan.persisted())
    assert plan.credentials["model"].secrets() == [KEY.encode()]


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"upstream": "http://api.example.com"}, "https URL"),
        ({"upstream": "https://user:pw@api.example.com"}, "https URL"),
        ({"upstream": "https://api.example.com/?q=1"}, "https URL"),
        ({"headers": {"Bad Name": "x"}}, "header name"),
        ({"headers": {"X-Key": "a\r\nInjected: 1"}}, "one non-empty line"),
        ({"phases": ["later"]}, "phases"),
    ],
)
def test_a_bad_route_is_refused_by_name(fields: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        _route(**fields)
    assert "Injected" not in str(info.value), "a header's value is never shown"


def test_route_names_are_env_names_that_do_not_collide() -> None:
    with pytest.raises(ValueError, match="'9x'"):
        ExecutionPlan(credentials={"9x": _route()})
    with pytest.raises(ValueError, match="share an env name"):
        ExecutionPlan(credentials={"model": _route(), "MODEL": _route()})


def test_a_route_serves_only_in_its_phases() -> None:
    route = _route(phases=["run"])
    assert route.serves_in("run")
    assert not route.serves_in("evaluation") and not route.serves_in(None)
    assert _route().serves_in(None)


def test_a_provider_without_credentials_refuses_a_plan_with_routes() -> None:
    with pytest.raises(FeatureUnsupported, match="credentials.*model"):
        LocalEnvironment().prepare(ExecutionPlan(credentials={"model": _route()}))


def test_the_redactor_strikes_a_secret_split_anywhere() -> None:
    text = f"a{KEY}b {KEY}".encode()
    for cut in range(len(text) + 1):
        redactor = Redactor([KEY.encode()])
        out = redactor.feed(text[:cut]) + redactor.feed(text[cut:]) + redactor.flush()
        assert out == b"a" + REDACTED + b"b " + REDACTED


def test_the_redactor_holds_back_only_what_could_begin_a_secret() -> None:
    redactor = Redactor([SecretStr(KEY).get_secret_value().encode()])
    assert redactor.feed(b"data: 1\n\n") == b"data: 1\n\n", "an event passes at once"
    assert redactor.feed(b"tail sk-unit") == b"tail ", "a possible start waits"
    assert redactor.feed(b" not it") == b"sk-unit not it"
    assert redactor.flush() == b""
