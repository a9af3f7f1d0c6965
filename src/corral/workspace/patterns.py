"""Glob patterns over relative paths: `*` and `?` stay within a name, `**` spans names."""

from __future__ import annotations

import re
from functools import lru_cache

from corral.errors import ConfigError


@lru_cache(maxsize=64)
def compile_pattern(pattern: str) -> re.Pattern[str]:
    """`**/*.py` matches `a.py` and `x/y/a.py`; names starting with a dot are not special."""
    if not pattern or pattern.startswith("/") or "\0" in pattern:
        raise ConfigError(f"pattern {pattern!r} must be a non-empty relative glob")
    parts = pattern.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ConfigError(f"pattern {pattern!r} has an empty, '.' or '..' component")
    regex = ""
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        if part == "**":
            regex += ".*" if last else "(?:[^/]+/)*"
            continue
        regex += _name(part, pattern) + ("" if last else "/")
    return re.compile(regex)


def _name(part: str, pattern: str) -> str:
    out = ""
    i = 0
    while i < len(part):
        char = part[i]
        if char == "*":
            out += "[^/]*"
        elif char == "?":
            out += "[^/]"
        elif char == "[":
            end = part.find("]", i + 2)
            if end < 0:
                raise ConfigError(f"pattern {pattern!r} has an unclosed '['")
            body = part[i + 1 : end]
            negate = body.startswith("!")
            body = re.escape(body[1:] if negate else body).replace("\\-", "-")
            out += f"[{'^/' if negate else ''}{body}]"
            i = end
        else:
            out += re.escape(char)
        i += 1
    return out


def matches(pattern: str, relative: str) -> bool:
    """Whether the relative posix path `relative` matches `pattern`."""
    return compile_pattern(pattern).fullmatch(relative) is not None
