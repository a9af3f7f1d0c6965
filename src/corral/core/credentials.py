"""Credential routes: keys an agent in the sandbox uses without ever holding them.

`ExecutionPlan.credentials` maps a name to a `CredentialRoute`. The sandbox gets only
`CORRAL_CRED_<NAME>_URL`: a plain-HTTP base URL of corral's proxy, which runs outside
the sandbox (on the harness's host) and forwards each request to the route's `upstream`
over TLS with the route's `headers` added. The header values never enter the sandbox:
not its environment, files or process list, and not any response (the proxy strikes
them out of what comes back). A route serves only in its `phases`.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from corral.network.policy import Phase

#: a route's name: its env variable is CORRAL_CRED_<NAME upper-cased>_URL
ROUTE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP header name (RFC 9110 token)


class CredentialRoute(BaseModel):
    """One upstream the sandbox reaches through corral's proxy, with headers it never sees."""

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    upstream: str = Field(
        description="https URL the route forwards to; a request for <route URL>/a/b goes to "
        "<upstream>/a/b"
    )
    headers: dict[str, SecretStr] = Field(
        default={}, description="headers added to every forwarded request (secret values)"
    )
    phases: frozenset[Phase] | None = Field(
        default=None, description="phases the route serves in; None: every phase"
    )
    ca_file: str | None = Field(
        default=None,
        description="PEM bundle of the CAs the upstream's certificate is checked against; "
        "None: the system's",
    )

    @field_validator("upstream")
    @classmethod
    def _upstream(cls, value: str) -> str:
        parts = urlsplit(value)
        if (
            parts.scheme != "https"
            or not parts.hostname
            or parts.username
            or parts.password
            or parts.query
            or parts.fragment
            or any(c.isspace() for c in value)
        ):
            raise ValueError(
                f"credential upstream {value!r} must be an https URL with a host and no "
                "user, password, query or fragment"
            )
        return value.rstrip("/")

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name, secret in value.items():
            if not _TOKEN.fullmatch(name):
                raise ValueError(f"credential header name {name!r} is not an HTTP header name")
            text = secret.get_secret_value()
            if not text or any(c in text for c in "\r\n\0"):
                # The value itself is never shown.
                raise ValueError(f"credential header {name!r} must be one non-empty line")
        return value

    def serves_in(self, phase: Phase | None) -> bool:
        return self.phases is None or (phase is not None and phase in self.phases)

    def secrets(self) -> list[bytes]:
        """The header values, to strike out of whatever comes back."""
        return [s.get_secret_value().encode() for s in self.headers.values()]


def route_env_name(name: str) -> str:
    return f"CORRAL_CRED_{name.upper()}_URL"


_ROUTE_ENV = re.compile(r"CORRAL_CRED_[A-Z][A-Z0-9_]{0,31}_URL")


def credential_env_of(env: list[str]) -> dict[str, str]:
    """The route variables among a container config's `NAME=value` entries."""
    pairs = (entry.partition("=") for entry in env)
    return {name: value for name, _, value in pairs if _ROUTE_ENV.fullmatch(name)}


def check_route_names(routes: dict[str, CredentialRoute]) -> dict[str, CredentialRoute]:
    seen: dict[str, str] = {}
    for name in routes:
        if not ROUTE_NAME.fullmatch(name):
            raise ValueError(
                f"credential route name {name!r} must be a letter then up to 31 letters, "
                "digits or _"
            )
        if name.upper() in seen:
            raise ValueError(
                f"credential routes {seen[name.upper()]!r} and {name!r} share an env name"
            )
        seen[name.upper()] = name
    return routes
