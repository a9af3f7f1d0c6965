"""The labels every corral resource carries, and the expiry test gc uses."""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Mapping

OWNER = "corral.owner"
SESSION = "corral.session"
EXPIRES_AT = "corral.expires-at"

_SESSION_ID = re.compile(r"^[a-z0-9]{12}$")


def new_session_id() -> str:
    """12 lowercase alphanumerics: valid in container, pod and label names alike."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(12))


def is_session_id(value: str) -> bool:
    return bool(_SESSION_ID.match(value))


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
