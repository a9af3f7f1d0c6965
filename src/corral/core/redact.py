"""Keep secret values out of logs, reprs and errors."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic import SecretStr

MASK = "***"


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
