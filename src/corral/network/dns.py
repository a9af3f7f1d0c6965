"""Name resolution that nothing inside the sandbox can steer.

A sandbox's `/etc/hosts`, `/etc/resolv.conf`, `getent` and libc are the workload's to
change, so corral never asks them. It builds DNS queries itself, sends them over TCP to
the resolver it chose for the sandbox network, from a container of corral's own image
(the holder, the probe container) with that image's `busybox nc`, and parses the answers
here. Harness-owned static entries (`extra_hosts`, `host_aliases`) are looked up first.
"""

from __future__ import annotations

import ipaddress
import secrets
import struct
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import NamedTuple

from corral.network.targets import IPAddress

#: `sh -c QUERY_SCRIPT sh SERVER` with the queries on stdin prints the raw answers as hex.
QUERY_SCRIPT = 'exec busybox nc -w 3 "$1" 53 | busybox xxd -p'
_A, _AAAA, _CNAME, _IN = 1, 28, 5, 1
#: TTL given to static entries, which never move.
STATIC_TTL = 86400


class Answer(NamedTuple):
    addresses: tuple[IPAddress, ...]
    ttl: int


class Query(NamedTuple):
    name: str
    qtype: int
    id: int


def _encode_name(name: str) -> bytes:
    labels = [label.encode("ascii") for label in name.rstrip(".").split(".")]
    if any(not 0 < len(label) < 64 for label in labels):
        raise ValueError(f"hostname {name!r} has an empty or over-long label")
    return b"".join(bytes([len(label)]) + label for label in labels) + b"\0"


def encode_queries(names: Sequence[str]) -> tuple[bytes, list[Query]]:
    """A and AAAA queries for each name, framed for DNS over TCP, with random ids."""
    wire = bytearray()
    queries: list[Query] = []
    for name in names:
        for qtype in (_A, _AAAA):
            qid = secrets.randbelow(1 << 16)
            message = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
            message += _encode_name(name) + struct.pack(">HH", qtype, _IN)
            wire += struct.pack(">H", len(message)) + message
            queries.append(Query(name, qtype, qid))
    return bytes(wire), queries


def _read_name(data: bytes, offset: int) -> tuple[str, int]:
    labels: list[str] = []
    end: int | None = None
    for _ in range(128):  # bounds compression-pointer loops
        length = data[offset]
        if length & 0xC0 == 0xC0:
            if end is None:
                end = offset + 2
            offset = ((length & 0x3F) << 8) | data[offset + 1]
            continue
        if length == 0:
            name = ".".join(labels).lower()
            return name, end if end is not None else offset + 1
        labels.append(data[offset + 1 : offset + 1 + length].decode("ascii", "replace"))
        offset += 1 + length
    raise ValueError("DNS name compression loops")


def _parse_message(message: bytes, query: Query) -> Answer:
    qid, flags, qdcount, ancount = struct.unpack(">HHHH", message[:8])
    if qid != query.id or not flags & 0x8000:
        raise ValueError(f"DNS answer for {query.name!r} does not match its query")
    rcode = flags & 0xF
    if rcode not in (0, 3):  # NOERROR, NXDOMAIN
        raise ValueError(f"DNS server answered {query.name!r} with rcode {rcode}")
    offset = 12
    for _ in range(qdcount):
        _, offset = _read_name(message, offset)
        offset += 4
    wanted = {query.name}
    addresses: list[IPAddress] = []
    ttl: int | None = None
    for _ in range(ancount):
        owner, offset = _read_name(message, offset)
        rtype, rclass, rttl, rdlength = struct.unpack(">HHIH", message[offset : offset + 10])
        offset += 10
        rdata = message[offset : offset + rdlength]
        rdata_at = offset
        offset += rdlength
        if rclass != _IN or owner not in wanted:
            continue
        if rtype == _CNAME:
            wanted.add(_read_name(message, rdata_at)[0])
        elif rtype == query.qtype and len(rdata) in (4, 16):
            addresses.append(ipaddress.ip_address(rdata))
        else:
            continue
        ttl = rttl if ttl is None else min(ttl, rttl)
    return Answer(tuple(addresses), ttl if ttl is not None else 0)


def parse_answers(hex_text: str, queries: Sequence[Query]) -> dict[str, Answer]:
    """Answers per name from QUERY_SCRIPT's output; a malformed answer is a ValueError."""
    data = bytes.fromhex("".join(hex_text.split()))
    pending = {q.id: q for q in queries}
    merged: dict[str, Answer] = {}
    offset = 0
    while offset + 2 <= len(data):
        (length,) = struct.unpack(">H", data[offset : offset + 2])
        message = data[offset + 2 : offset + 2 + length]
        offset += 2 + length
        if len(message) < 12:
            break
        query = pending.pop(struct.unpack(">H", message[:2])[0], None)
        if query is None:
            raise ValueError("DNS answer with an id no query of corral's carries")
        answer = _parse_message(message, query)
        seen = merged.get(query.name)
        if seen is None:
            merged[query.name] = answer
        else:
            ttls = [a.ttl for a in (seen, answer) if a.addresses]
            merged[query.name] = Answer(seen.addresses + answer.addresses, min(ttls) if ttls else 0)
    # A query left unanswered (Docker's resolver drops those it cannot forward) resolves
    # to nothing: an allowlist then allows nothing, a denylist refuses to apply.
    for query in pending.values():
        merged.setdefault(query.name, Answer((), 0))
    return merged


def static_answers(
    names: Sequence[str], static: Mapping[str, str | Sequence[str]]
) -> dict[str, Answer]:
    """Harness-owned entries (`extra_hosts`): names found there skip DNS."""
    found: dict[str, Answer] = {}
    table = {k.lower().rstrip("."): v for k, v in static.items()}
    for name in names:
        entry = table.get(name)
        if entry is None:
            continue
        values = [entry] if isinstance(entry, str) else list(entry)
        addresses = tuple(ipaddress.ip_address(v) for v in values if v != "host-gateway")
        found[name] = Answer(addresses, STATIC_TTL)
    return found


#: Runs `argv` with `stdin` in a container of corral's own image; returns its stdout.
Runner = Callable[[list[str], bytes], Awaitable[str]]


async def resolve_names(
    names: Sequence[str],
    *,
    servers: Sequence[IPAddress],
    run: Runner,
    static: Mapping[str, str | Sequence[str]] | None = None,
    script: str = QUERY_SCRIPT,
    args: Sequence[str] = (),
) -> dict[str, Answer]:
    """Resolve `names`: static entries first, then the first of `servers` that answers.

    Each server is asked by `sh -c SCRIPT sh SERVER ARGS...` with the framed queries on
    stdin, which prints the framed answers as hex (QUERY_SCRIPT: busybox nc; a provider
    may send them another way, e.g. from a marked socket).

    A name neither source knows maps to an empty answer; a malformed or forged answer
    raises `ValueError` (the caller fails closed).
    """
    unique = list(dict.fromkeys(n.lower().rstrip(".") for n in names))
    found = static_answers(unique, static or {})
    rest = [n for n in unique if n not in found]
    if not rest:
        return found
    errors: list[str] = []
    for server in servers:
        wire, queries = encode_queries(rest)
        output = await run(["sh", "-c", script, "sh", str(server), *args], wire)
        if not output.strip():
            errors.append(f"{server}: no answer")
            continue
        try:
            return {**found, **parse_answers(output, queries)}
        except ValueError as exc:
            errors.append(f"{server}: {exc}")
    if errors and len(errors) == len(servers) and not all(e.endswith("no answer") for e in errors):
        raise ValueError(f"resolving {', '.join(rest)} failed ({'; '.join(errors)})")
    # No resolver, or none that answered anything: these names resolve to nothing.
    return {**found, **{n: Answer((), 0) for n in rest}}
