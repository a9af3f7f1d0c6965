"""The policy in force, written into the ruleset that enforces it, and read back from there.

`render_iptables` adds a chain no packet ever enters (`CORRAL-POLICY`) whose rules carry,
in iptables comments, the normalized policy and the resolvers it was rendered with
(base64 of their JSON). Read back from the kernel (`iptables-save` in the holder), it tells
a process that did not apply the policy (one that reattaches) what is in force, from
state that only NET_ADMIN in that namespace can change: the sandbox has none, and no file
it writes takes part. A comment holds at most 255 bytes, so the text is split into
numbered pieces, and a record with a piece missing or repeated is refused.
"""

from __future__ import annotations

import base64
import binascii
import re

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from corral.network.addresses import IPAddress, canonical_address
from corral.network.policy import NetworkPolicy

RECORD_CHAIN = "CORRAL-POLICY"
_PREFIX = "corral-policy"
#: base64 characters per comment, well under the kernel's 255-byte limit with the prefix
_PIECE = 200
_LINE = re.compile(
    rf'^-A {RECORD_CHAIN} -m comment --comment "?{_PREFIX}:(\d+)/(\d+):([A-Za-z0-9_=-]+)"?$'
)


class PolicyRecord(BaseModel):
    """What corral applied in one network namespace."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: NetworkPolicy
    #: the namespace's resolvers as corral read them before the sandbox joined it
    dns_servers: tuple[IPAddress, ...]

    @field_validator("dns_servers", mode="after")
    @classmethod
    def _canonical(cls, value: tuple[IPAddress, ...]) -> tuple[IPAddress, ...]:
        # A resolution built without validation may carry zone ids (as a sandbox's
        # resolver answers them); the kernel, and so the record, never sees them.
        return tuple(canonical_address(a) for a in value)


def record_rules(record: PolicyRecord) -> list[str]:
    """`iptables-restore` rules that carry `record`, for a table that declares
    `RECORD_CHAIN`."""
    text = base64.urlsafe_b64encode(record.model_dump_json().encode()).decode()
    pieces = [text[i : i + _PIECE] for i in range(0, len(text), _PIECE)]
    count = len(pieces)
    return [
        f'-A {RECORD_CHAIN} -m comment --comment "{_PREFIX}:{index}/{count}:{piece}"'
        for index, piece in enumerate(pieces, 1)
    ]


def read_record(saved: str) -> PolicyRecord:
    """The record in `iptables-save` output; `ValueError` saying what is wrong when it is
    missing, incomplete or not a policy corral wrote."""
    pieces: dict[int, str] = {}
    counts: set[int] = set()
    for line in saved.splitlines():
        found = _LINE.match(line.strip())
        if found is None:
            continue
        index, count, piece = int(found[1]), int(found[2]), found[3]
        if index in pieces:
            raise ValueError(f"piece {index} of the policy record appears twice")
        pieces[index] = piece
        counts.add(count)
    if not pieces:
        raise ValueError(f"no policy record in chain {RECORD_CHAIN}")
    totals = sorted(counts)
    if len(totals) != 1 or set(pieces) != set(range(1, totals[0] + 1)):
        raise ValueError(f"the policy record has pieces {sorted(pieces)} of {totals}")
    text = "".join(pieces[i] for i in sorted(pieces))
    try:
        return PolicyRecord.model_validate_json(base64.urlsafe_b64decode(text))
    except (binascii.Error, ValidationError) as exc:
        raise ValueError(f"the policy record is not one corral wrote: {exc}") from None
