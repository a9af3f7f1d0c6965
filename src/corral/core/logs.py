"""Lifecycle events under `corral.*`: readable text, with the fields also as `extra`.

Callers pass ids, phases, modes, durations and image names only, never env mappings,
secret values or signed URLs.
"""

from __future__ import annotations

import logging
from typing import Any

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def event(logger: logging.Logger, level: str, message: str, **fields: Any) -> None:
    number = _LEVELS[level]
    if not logger.isEnabledFor(number):
        return
    text = " ".join(f"{key}={value}" for key, value in fields.items())
    logger.log(number, "%s %s", message, text, extra={"corral": fields})
