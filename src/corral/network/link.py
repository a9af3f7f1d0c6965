"""A gateway's link: the veth pair between the holder's namespace and a sandbox's own
(`providers.docker.gateway`), by name and address. Whatever arrives on `LINK` was sent by
the sandbox, whatever network stack made it."""

from __future__ import annotations

import ipaddress

#: the holder's end of the link (the sandbox's end is `eth0` in its own namespace)
LINK = "corral-gw"
_NET = ipaddress.IPv4Network("169.254.77.0/30")
#: the holder's address on the link: the sandbox's default route and nameserver
HOLDER_SIDE = _NET[1]
#: the sandbox's address on the link
SANDBOX_SIDE = _NET[2]
