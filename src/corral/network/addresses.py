"""Addresses as the sandbox's C library reads them, and the only text a rule holds for one.

A policy must mean what the sandbox will do. Its C library reads `127.1`, `0x7f.1` and
`2130706433` as 127.0.0.1 (`inet_aton`), and an IPv6 socket sends to a v4-mapped address
(`::ffff:a.b.c.d`) over IPv4, where only IPv4 rules see it. A zone id (`fe80::1%eth0`)
is free text that Python's `ipaddress` keeps in `str()`. So addresses are folded to the
family and value the kernel sees, and rule text is rebuilt from an address's integer, which
cannot carry anything but the address.
"""

from __future__ import annotations

import ipaddress
import re

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
# A label `inet_aton` may read as a number; the input is already lowercase.
NUMERIC_LABEL = re.compile(r"0x[0-9a-f]*|[0-9]+")


def inet_aton(text: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address the C library's `inet_aton` reads from `text`, or None.

    One to four dot-separated parts, each decimal, octal (leading `0`) or hex (`0x`); the
    last part fills the bytes the others leave.
    """
    parts = text.lower().split(".")
    if len(parts) > 4:
        return None
    values: list[int] = []
    for part in parts:
        if part.startswith("0x") and NUMERIC_LABEL.fullmatch(part):
            values.append(int(part[2:] or "0", 16))
        elif re.fullmatch(r"0[0-7]*", part):
            values.append(int(part, 8))
        elif re.fullmatch(r"[1-9][0-9]*", part):
            values.append(int(part))
        else:
            return None
    *head, last = values
    if any(v > 0xFF for v in head) or last >= 1 << (8 * (4 - len(head))):
        return None
    leading = sum(v << (8 * (3 - i)) for i, v in enumerate(head))
    return ipaddress.IPv4Address(leading + last)


def canonical_address(address: IPAddress) -> IPAddress:
    """`address` without a zone id; a v4-mapped address as the IPv4 address it reaches."""
    if address.version == 4:
        return ipaddress.IPv4Address(int(address))
    plain = ipaddress.IPv6Address(int(address))
    return plain.ipv4_mapped or plain


def canonical_network(network: IPNetwork) -> IPNetwork:
    """`network` without a zone id; a block inside `::ffff:0:0/96` as its IPv4 block."""
    plain = _rebuilt(network)
    if isinstance(plain, ipaddress.IPv6Network) and plain.subnet_of(_MAPPED):
        offset = int(_MAPPED.network_address)
        first = int(plain.network_address) - offset
        return ipaddress.IPv4Network((first, plain.prefixlen - _MAPPED.prefixlen))
    return plain


def rule_text(network: IPNetwork) -> str:
    """The text a renderer writes for `network`: rebuilt from its integer, nothing else."""
    return str(_rebuilt(network))


def _rebuilt(network: IPNetwork) -> IPNetwork:
    first, prefix = int(network.network_address), network.prefixlen
    if network.version == 4:
        return ipaddress.IPv4Network((first, prefix))
    return ipaddress.IPv6Network((first, prefix))
