"""The labels every corral resource carries, and the expiry test gc uses."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Mapping

from corral.errors import ConfigError

OWNER = "corral.owner"
SESSION = "corral.session"
EXPIRES_AT = "corral.expires-at"

# Valid inside container, Pod, NetworkPolicy and label names alike, with room for the
# longest suffix corral adds (`-holder-pooled`, `corral-…-resolver-xxxxxx`).
_SESSION_ID = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?$")


def new_session_id() -> str:
    """12 lowercase alphanumerics."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(12))


def is_session_id(value: str) -> bool:
    return bool(_SESSION_ID.match(value))


def checked_session_id(value: str) -> str:
    """`value` if a caller may name a session so, else a `ConfigError` naming it."""
    if not isinstance(value, str) or not is_session_id(value):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ConfigError(
            f"session_id {value!r} must be 1 to 32 lowercase letters, digits or '-', "
            "starting and ending with a letter or digit"
        )
    return value


def session_labels(
    owner: str, session_id: str, lifetime_s: float, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    expires = int(time.time() + lifetime_s)
    return {**(extra or {}), OWNER: owner, SESSION: session_id, EXPIRES_AT: str(expires)}


def is_expired(labels: Mapping[str, str], owner: str, now: float | None = None) -> bool:
    """True only for resources that carry all of corral's labels, for `owner`, past expiry."""
    if labels.get(OWNER) != owner or not is_session_id(labels.get(SESSION, "")):
        return False
    try:
        expires = int(labels[EXPIRES_AT])
    except (KeyError, ValueError):
        return False
    return expires <= (time.time() if now is None else now)
