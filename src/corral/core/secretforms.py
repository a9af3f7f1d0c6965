"""Every form a credential header's value can come back in, and the stream redactor
that strikes them all (corral's credential proxy, `corral.core.credproxy`).

An upstream that names what it got ("Incorrect API key provided: <key>") rarely says
the whole header: it says the key without its scheme, or one part of a composite
value, and it may say it base64-, URL-, JSON- or hex-encoded. So a value stands for
its tokens and pieces (a Basic credential for its decoded user and password too), and
each of those for its encodings; a base64 stream holding a secret at any offset
carries one of three alignments of it, of which only the characters that depend on the
secret alone are struck. Pieces shorter than `MIN_PIECE` are not struck on their own:
they would strike ordinary words and carry little of a secret.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Iterator
from urllib.parse import quote, quote_plus

REDACTED = b"[redacted by corral]"
#: bytes a token, piece or encoded form needs to be struck on its own (the whole
#: value is struck whatever its length)
MIN_PIECE = 8
_WORDS = re.compile(rb"\S+")
_SEPARATORS = re.compile(rb"[:,=;\"']+")
#: an auth scheme ("Bearer", "Basic", "Digest"): the first word of several, letters only
_SCHEME = re.compile(rb"[A-Za-z][A-Za-z-]*")
_PERCENT = re.compile(r"%[0-9A-F]{2}")
_UNICODE_ESCAPE = re.compile(r"\\u[0-9a-f]{4}")
_URLSAFE = bytes.maketrans(b"+/", b"-_")
#: what Go's encoding/json escapes beyond JSON's own
_HTML_SAFE = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"}
#: bytes of a form's head that `SecretForms.partial_tail` looks for
_HEAD = 4


def forms_of(value: bytes) -> set[bytes]:
    """Every form of `value` to strike: the value, its pieces, and their encodings."""
    plain = {value, *_pieces(value)}
    forms = set(plain)
    for raw in plain:
        forms |= {raw.hex().encode(), raw.hex().upper().encode(), *_escapes(raw)}
        for core in _base64_cores(raw):
            forms |= {core, *_escapes(core)}
    return {form for form in forms if form == value or len(form) >= MIN_PIECE}


def _pieces(value: bytes) -> set[bytes]:
    """The words of `value` but a leading scheme, their parts between separators, and a
    Basic credential's decoded user and password: those at least `MIN_PIECE` long."""
    words = _WORDS.findall(value)
    if len(words) > 1 and _SCHEME.fullmatch(words[0]):
        scheme, words = words[0], words[1:]
        if scheme.lower() == b"basic":
            words += _basic(words[0])
    parts = {part for word in words for part in (word, *_SEPARATORS.split(word))}
    return {part for part in parts if len(part) >= MIN_PIECE}


def _basic(token: bytes) -> list[bytes]:
    try:
        decoded = base64.b64decode(token + b"==", validate=False)
    except (binascii.Error, ValueError):
        return []
    user, _, password = decoded.partition(b":")
    return [decoded, user, password]


def _base64_cores(raw: bytes) -> set[bytes]:
    """For each of the three offsets `raw` can sit at in a base64 stream, the characters
    that depend on its bytes alone, in the standard and the URL-safe alphabet."""
    cores: set[bytes] = set()
    for shift in range(3):
        text = base64.b64encode(b"\0" * shift + raw + b"\0\0")
        first = -(-8 * shift // 6)
        last = (8 * (shift + len(raw)) - 6) // 6
        core = text[first : last + 1]
        cores |= {core, core.translate(_URLSAFE)}
    return cores


def _escapes(raw: bytes) -> set[bytes]:
    """`raw` URL-encoded (path and form style, either hex case) and JSON-escaped (ASCII
    or not, `/` as `\\/`, HTML-safe, either hex case)."""
    encoded = {quote(raw, safe=""), quote(raw), quote_plus(raw, safe="")}
    encoded |= {_PERCENT.sub(lambda m: m.group().lower(), text) for text in encoded}
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        return {form.encode() for form in encoded}
    ascii_json = json.dumps(text)[1:-1]
    html_safe = "".join(_HTML_SAFE.get(c, c) for c in ascii_json)
    escaped = {ascii_json, json.dumps(text, ensure_ascii=False)[1:-1], html_safe}
    escaped |= {form.replace("/", "\\/") for form in escaped}
    escaped |= {_UNICODE_ESCAPE.sub(lambda m: "\\u" + m.group()[2:].upper(), f) for f in escaped}
    return {form.encode() for form in encoded | escaped}


class SecretForms:
    """The forms of a set of secrets, longest first. Each is looked for with
    `bytes.replace` / `bytes.find` (one linear scan a form), so that a chunk costs
    forms x bytes and never more; a form cut off by a chunk's end begins where the first
    `_HEAD` bytes of one are, or in the chunk's last `_HEAD` bytes."""

    def __init__(self, secrets: Iterable[bytes]) -> None:
        self._forms = sorted({f for s in secrets if s for f in forms_of(s)}, key=len, reverse=True)
        self._heads = {form[:_HEAD] for form in self._forms}
        self._by_first: dict[int, list[bytes]] = {}
        for form in self._forms:
            self._by_first.setdefault(form[0], []).append(form)
        #: the longest form's length: a held tail is always shorter
        self.longest = len(self._forms[0]) if self._forms else 0

    def strike(self, data: bytes) -> bytes:
        """`data` with every form in it replaced."""
        for form in self._forms:
            data = data.replace(form, REDACTED)
        return data

    def partial_tail(self, data: bytes) -> int:
        """The length of the longest end of `data` that begins a form (looked for only in
        the last `longest - 1` bytes)."""
        low = max(0, len(data) - self.longest + 1)
        ends = range(max(low, len(data) - _HEAD + 1), len(data))
        for start in sorted({*self._head_starts(data, low), *ends}):
            tail = data[start:]
            if any(form.startswith(tail) for form in self._by_first.get(tail[0], ())):
                return len(data) - start
        return 0

    def _head_starts(self, data: bytes, low: int) -> Iterator[int]:
        for head in self._heads:
            start = data.find(head, low)
            while start >= 0:
                yield start
                start = data.find(head, start + 1)


class Redactor:
    """Strikes every form of some secrets out of a stream of chunks, holding back only a
    tail that could be the start of one (so a stream's pieces come through as they
    come)."""

    def __init__(self, forms: SecretForms) -> None:
        self._forms = forms
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._forms.strike(self._held + chunk)
        keep = self._forms.partial_tail(data)
        self._held = data[len(data) - keep :] if keep else b""
        return data[: len(data) - keep]

    def strike(self, whole: bytes) -> bytes:
        """A whole value (a header's) with every form struck; nothing is held."""
        return self._forms.strike(whole)

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return self._forms.strike(held)
