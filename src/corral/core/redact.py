"""Keep secret values out of logs, reprs and errors."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from typing import TypeVar

from pydantic import SecretStr

MASK = "***"
V = TypeVar("V")

# Found anywhere in the name once separators are gone: `OPENAI_API_KEY`, `PGPASSWORD`.
_SECRET_INFIXES = (
    "KEY",
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
    "COOKIE",
    "SESSION",
    "PRIVATE",
    "SIGNATURE",
    "AUTHORIZATION",
    "OAUTH",
    "BEARER",
)
# Short words, found only as a whole part (`DB_PASS`, `SENTRY_DSN`), so `AUTHOR` is not one.
_SECRET_PARTS = frozenset({"AUTH", "PASS", "PWD", "DSN", "CREDS", "SALT"})
_PART_BREAK = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")


def looks_secret(name: str) -> bool:
    """Whether an environment variable's name says its value is a credential."""
    parts = {part.upper() for part in _PART_BREAK.split(name) if part}
    glued = re.sub(r"[^A-Z0-9]", "", name.upper())
    return bool(parts & _SECRET_PARTS) or any(word in glued for word in _SECRET_INFIXES)


def masked_env(env: Mapping[str, V], public: Collection[str]) -> dict[str, V | SecretStr]:
    """`env` with every string value whose name looks secret, and is not `public`, a SecretStr."""
    return {
        name: SecretStr(value)
        if isinstance(value, str) and name not in public and looks_secret(str(name))
        else value
        for name, value in env.items()
    }


def secret_values(env: Mapping[str, str | SecretStr]) -> list[str]:
    return [v.get_secret_value() for v in env.values() if isinstance(v, SecretStr) and v]


def redact(text: str, secrets: Iterable[str]) -> str:
    # Longest first so that a secret containing another is masked whole.
    for secret in sorted(set(secrets), key=len, reverse=True):
        if secret:
            text = text.replace(secret, MASK)
    return text


def plain_env(env: Mapping[str, str | SecretStr]) -> dict[str, str]:
    """The env a process needs; never log the result."""
    return {k: v.get_secret_value() if isinstance(v, SecretStr) else v for k, v in env.items()}
