"""Credential routes as a plan holds them (secrets never shown, names and URLs checked),
and the proxy's redactor: every form a header value can come back in (its tokens and
pieces, base64 at any alignment, URL, JSON and hex) is struck, split across any two
pieces or any random chunking, and nothing else is held back. The proxy itself runs on
loopback in test_credential_proxy.py and against a real engine in
tests/integration/docker/test_docker_credentials.py."""

from __future__ import annotations

import base64
import json
import random
import re
from urllib.parse import quote, quote_plus

import pytest
from pydantic import SecretStr

from corral import ExecutionPlan, FeatureUnsupported
from corral.core.credentials import CredentialRoute
from corral.core.secretforms import REDACTED, Redactor, SecretForms
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
        redactor = Redactor(SecretForms([KEY.encode()]))
        out = redactor.feed(text[:cut]) + redactor.feed(text[cut:]) + redactor.flush()
        assert out == b"a" + REDACTED + b"b " + REDACTED


def test_the_redactor_holds_back_only_what_could_begin_a_secret() -> None:
    redactor = Redactor(SecretForms([SecretStr(KEY).get_secret_value().encode()]))
    assert redactor.feed(b"data: 1\n\n") == b"data: 1\n\n", "an event passes at once"
    assert redactor.feed(b"tail sk-unit") == b"tail ", "a possible start waits"
    assert redactor.feed(b" not it") == b"sk-unit not it"
    assert redactor.flush() == b""


BARE = "sk-proj-Zx81/Qa+9kLm_0Tr=="
BASIC_USER, BASIC_PASSWORD = "svc-reader", "pa55/word+Zq"
HEADERS = [
    f"Bearer {BARE}",
    "Basic " + base64.b64encode(f"{BASIC_USER}:{BASIC_PASSWORD}".encode()).decode(),
    "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE0123/20261207, Signature=5d672d79c15b1316",
]


def _b64_at(secret: bytes, shift: int, alphabet: str) -> tuple[bytes, bytes]:
    """A base64 stream holding `secret` after `shift` bytes, and its characters that
    depend on the secret alone (what must not come back)."""
    stream = base64.b64encode(b"\x01" * shift + secret + b"\x02\x03\x04")
    core = stream[-(-8 * shift // 6) : (8 * (shift + len(secret)) - 6) // 6 + 1]
    if alphabet == "urlsafe":
        stream, core = (t.translate(bytes.maketrans(b"+/", b"-_")) for t in (stream, core))
    return stream, core


def _leaks() -> list[tuple[str, bytes, bytes]]:
    """(what, text an upstream sends, what must not be in what comes back)."""
    secrets = {
        "bare": BARE,
        "password": BASIC_PASSWORD,
        "user:password": f"{BASIC_USER}:{BASIC_PASSWORD}",
    }
    secrets["signature"] = "5d672d79c15b1316"
    leaks: list[tuple[str, bytes, bytes]] = []
    for name, secret in secrets.items():
        raw = secret.encode()
        encoded = {
            "raw": raw,
            "quote": quote(secret, safe="").encode(),
            "quote-lower": re.sub(
                "%..", lambda m: m.group().lower(), quote(secret, safe="")
            ).encode(),
            "quote-path": quote(secret).encode(),
            "quote_plus": quote_plus(secret).encode(),
            "json": json.dumps(secret)[1:-1].encode(),
            "json-slash": json.dumps(secret)[1:-1].replace("/", "\\/").encode(),
            "hex": raw.hex().encode(),
            "HEX": raw.hex().upper().encode(),
        }
        for what, form in encoded.items():
            leaks.append((f"{name} {what}", b"Incorrect API key provided: " + form + b".", form))
        for shift in range(3):
            for alphabet in ("std", "urlsafe"):
                stream, core = _b64_at(raw, shift, alphabet)
                leaks.append((f"{name} base64 {alphabet} at {shift}", b"token=" + stream, core))
        padded = base64.b64encode(raw)
        leaks.append((f"{name} base64 alone", b'"' + padded + b'"', padded.rstrip(b"=")))
    return leaks


@pytest.mark.parametrize(("what", "text", "secret"), _leaks(), ids=lambda v: str(v)[:40])
def test_every_form_of_a_key_is_struck_split_anywhere(
    what: str, text: bytes, secret: bytes
) -> None:
    forms = SecretForms(h.encode() for h in HEADERS)
    assert secret not in forms.strike(text), what
    for cut in range(len(text) + 1):
        redactor = Redactor(forms)
        out = redactor.feed(text[:cut]) + redactor.feed(text[cut:]) + redactor.flush()
        assert secret not in out and REDACTED in out, (what, cut)


def test_random_chunks_never_carry_a_form_and_keep_the_rest() -> None:
    """Any chunking of leaks and plain text: no leak's secret comes through, and the
    plain text between them all does (a chunk's end may make a shorter form be struck
    before a longer one could be seen: the marks differ, never what leaks)."""
    forms = SecretForms(h.encode() for h in HEADERS)
    leaks = _leaks()
    rng = random.Random(40)
    for _ in range(300):
        chosen = [rng.choice(leaks) for _ in range(rng.randint(1, 6))]
        text = b" filler ".join(leak[1] for leak in chosen)
        cuts = sorted(rng.sample(range(len(text) + 1), rng.randint(0, min(12, len(text)))))
        redactor = Redactor(forms)
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        out = b"".join(map(redactor.feed, pieces)) + redactor.flush()
        assert not [what for what, _, secret in chosen if secret in out], (pieces, out)
        assert out.count(b" filler ") == len(chosen) - 1, (pieces, out)


def test_a_scheme_word_and_short_pieces_are_not_struck() -> None:
    redactor = Redactor(SecretForms([b"Bearer " + BARE.encode(), b"Token ab:cd"]))
    text = b"use a Bearer or Basic token, not ab or cd"
    assert redactor.feed(text) + redactor.flush() == text


def test_the_held_tail_is_shorter_than_the_longest_form() -> None:
    """A stream of near-misses (each the start of a key, never the rest) comes through as it comes:
    never more than a form's length is held back, whatever has come before."""
    forms = SecretForms(h.encode() for h in HEADERS)
    redactor = Redactor(forms)
    near = BARE.encode()[:10]
    given = 0
    for sent in range(1, 2001):
        given += len(redactor.feed(near))
        assert len(near) * sent - given < forms.longest
    assert given + len(redactor.flush()) == len(near) * 2000
