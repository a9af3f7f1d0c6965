"""Network targets: parsing and normalization of `host`, `host:port`, `[v6]:port`."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, model_serializer, model_validator

from corral.network.addresses import (
    NUMERIC_LABEL,
    IPAddress,
    IPNetwork,
    canonical_address,
    canonical_network,
    inet_aton,
)

__all__ = ["EntryType", "IPAddress", "IPNetwork", "NetworkTarget", "normalize_host"]

_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class EntryType(StrEnum):
    HOSTNAME = "hostname"
    WILDCARD_HOSTNAME = "wildcard-hostname"
    IPV4_ADDRESS = "ipv4-address"
    IPV6_ADDRESS = "ipv6-address"
    IPV4_CIDR = "ipv4-cidr"
    IPV6_CIDR = "ipv6-cidr"


class NetworkTarget(BaseModel):
    """One normalized entry of an allow- or denylist.

    Parses from `"host"`, `"host:port"`, `"[v6]:port"` or `{"host": ..., "port": ...}`
    and serializes back to that string form.
    """

    model_config = ConfigDict(frozen=True)

    host: str
    port: int | None = None
    entry_type: EntryType

    @model_validator(mode="before")
    @classmethod
    def _parse(cls, value: Any) -> Any:
        if isinstance(value, NetworkTarget):
            return value
        if isinstance(value, str):
            host, port = _split_port(value)
        elif isinstance(value, Mapping):
            mapping: Mapping[str, Any] = value  # pyright: ignore[reportUnknownVariableType]
            unknown = set(mapping) - {"host", "port", "entry_type"}
            if unknown or "host" not in mapping:
                raise ValueError(
                    f"network target {dict(mapping)!r} must be a mapping with 'host' "
                    "and an optional 'port'"
                )
            host, port = mapping["host"], mapping.get("port")
            if not isinstance(host, str):
                raise ValueError(f"network target host {host!r} must be a string")
        else:
            raise ValueError(f"network target {value!r} must be a string or a mapping")
        host, entry_type = normalize_host(host)
        return {"host": host, "port": _check_port(port, host), "entry_type": entry_type}

    @model_serializer
    def _to_str(self) -> str:
        return str(self)

    def __str__(self) -> str:
        if self.port is None:
            return self.host
        if ":" in self.host:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"

    @property
    def is_hostname(self) -> bool:
        return self.entry_type in (EntryType.HOSTNAME, EntryType.WILDCARD_HOSTNAME)

    def network(self) -> IPNetwork:
        """The address block of an address or CIDR entry (hostnames have none)."""
        if self.is_hostname:
            raise ValueError(f"network target {self} is a hostname; resolve it first")
        return ipaddress.ip_network(self.host)


def _split_port(text: str) -> tuple[str, int | str | None]:
    if text != text.strip() or any(c.isspace() for c in text) or not text:
        raise ValueError(f"network target {text!r} must not be empty or contain whitespace")
    if "://" in text:
        raise ValueError(f"network target {text!r} is a URL; give a host or host:port")
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise ValueError(f"network target {text!r} has an unclosed '['")
        host, rest = text[1:close], text[close + 1 :]
        if ":" not in host:
            raise ValueError(f"network target {text!r}: brackets are only for IPv6 addresses")
        if not rest:
            return host, None
        if not rest.startswith(":"):
            raise ValueError(f"network target {text!r}: expected ':port' after ']'")
        return host, rest[1:]
    if text.count(":") == 1:
        host, port = text.split(":")
        return host, port
    return text, None


def _check_port(port: object, host: str) -> int | None:
    if port is None:
        return None
    if isinstance(port, bool):
        raise ValueError(f"port {port!r} of network target {host!r} must be 1-65535")
    if isinstance(port, str):
        if not port.isdigit():
            raise ValueError(f"port {port!r} of network target {host!r} must be 1-65535")
        port = int(port)
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port {port!r} of network target {host!r} must be 1-65535")
    return port


def normalize_host(raw: str) -> tuple[str, EntryType]:
    """Normalize a host entry and classify it; raises ValueError naming the entry.

    Addresses come out as the kernel will see them: a v4-mapped address or block is IPv4.
    """
    text = raw.strip()
    if not text or text != raw:
        raise ValueError(f"network target host {raw!r} must not be empty or padded")
    if "://" in text:
        raise ValueError(f"network target {raw!r} is a URL; give a host or host:port")
    if "%" in text:
        raise ValueError(f"network target {raw!r}: zone ids ('%...') are not supported")
    if "/" in text:
        try:
            net = canonical_network(ipaddress.ip_network(text, strict=True))
        except ValueError as exc:
            raise ValueError(
                f"network target {raw!r} is not a canonical CIDR (paths and URLs are not "
                f"targets): {exc}"
            ) from None
        kind = EntryType.IPV4_CIDR if net.version == 4 else EntryType.IPV6_CIDR
        return str(net), kind
    try:
        addr = canonical_address(ipaddress.ip_address(text))
    except ValueError:
        pass
    else:
        kind = EntryType.IPV4_ADDRESS if addr.version == 4 else EntryType.IPV6_ADDRESS
        return str(addr), kind
    return _normalize_hostname(raw, text)


def _normalize_hostname(raw: str, text: str) -> tuple[str, EntryType]:
    name = text.lower().removesuffix(".")
    wildcard = name.startswith("*.")
    if wildcard:
        name = name[2:]
    if "*" in name:
        raise ValueError(f"network target {raw!r}: '*' is allowed only as a leading '*.' label")
    try:
        ascii_name = name.encode("idna").decode("ascii")
    except UnicodeError as exc:
        raise ValueError(f"network target {raw!r} is not a valid hostname: {exc}") from None
    labels = ascii_name.split(".")
    if len(ascii_name) > 253 or any(not _LABEL.match(label) for label in labels):
        raise ValueError(
            f"network target {raw!r} is not a valid hostname "
            "(labels of letters, digits and '-', none empty)"
        )
    if all(NUMERIC_LABEL.fullmatch(label) for label in labels):
        # The C resolver would not look such a name up: it reads it as a number, or fails.
        read_as = inet_aton(ascii_name)
        if read_as is not None:
            raise ValueError(
                f"network target {raw!r} is read as the IPv4 address {read_as} by the C "
                f"library (inet_aton); write {str(read_as)!r}"
            )
        raise ValueError(f"network target {raw!r} is not a valid IP address or hostname")
    if wildcard:
        if len(labels) < 2:
            raise ValueError(
                f"network target {raw!r}: a wildcard needs a domain like *.example.com"
            )
        return f"*.{ascii_name}", EntryType.WILDCARD_HOSTNAME
    return ascii_name, EntryType.HOSTNAME
