"""The holder as the sandbox's gateway: a namespace of the sandbox's own, routed through
the holder's, for runtimes whose packets skip the netfilter of the namespace they join.

gVisor's `runsc` runs the sandbox's network stack in its own kernel and writes frames to
the namespace's interface directly, so rules in that namespace never see them; it also
takes the interface's addresses for its stack. With a gateway the sandbox's namespace
belongs to a third container of corral's image (`net`, no network of its own, in the
holder's PID namespace), whose only link is a veth pair into the holder: every packet the
sandbox sends, whatever stack made it, arrives in the holder's namespace and is forwarded
there through corral's chain (`network.iptables` hooks it from FORWARD and INPUT for
`LINK`). The holder NATs it out on the session's network, answers DNS on its end of the
link with the network's resolver, and forwards what arrives for the sandbox (published
ports, `endpoint()`) to it. IPv6 is not routed: the sandbox has none.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

from docker.errors import APIError

from corral.errors import ProviderError
from corral.network.link import HOLDER_SIDE, LINK, SANDBOX_SIDE
from corral.providers.docker.engine import Engine
from corral.providers.docker.execution import run_own
from corral.providers.docker.resources import ROLE, net_name, remove_container

#: what the holder's namespace needs to route the link: forwarding, and DNS answered on
#: the link by Docker's resolver on loopback (route_localnet; `default` only, so the
#: session network's interface, made before, keeps refusing loopback destinations)
HOLDER_SYSCTLS = {
    "net.ipv4.ip_forward": "1",
    "net.ipv4.conf.default.route_localnet": "1",
}

# In the holder: the link into the net container's namespace (the one process of the
# PID namespace they share in another network namespace), and the NAT around it. Docker's
# resolver listens on 127.0.0.11 at ports its own DNATs name; the link's DNS goes there.
_LINK = r"""
set -e
holder=$1 sandbox=$2
own=$(readlink /proc/self/ns/net)
pid=
for p in /proc/[0-9]*; do
  ns=$(readlink "$p/ns/net" 2>/dev/null) || continue
  [ "$ns" != "$own" ] && pid=${p#/proc/} && break
done
if [ -z "$pid" ]; then
  echo "the net container's process is not in the holder's PID namespace" >&2; exit 3
fi
port() {
  iptables-save -t nat | sed -n "s/.*-d 127.0.0.11\/32 -p $1 .*--dport 53 \
-j DNAT --to-destination 127.0.0.11:\([0-9]*\).*/\1/p" | head -n 1
}
udp=$(port udp) tcp=$(port tcp)
if [ -z "$udp" ] || [ -z "$tcp" ]; then
  echo "no Docker resolver on 127.0.0.11 to answer DNS" >&2; exit 4
fi
mtu=$(cat /sys/class/net/eth0/mtu)
ip link add LINK mtu "$mtu" type veth peer name eth0 mtu "$mtu" netns "$pid"
ip addr add "$holder/30" dev LINK
ip link set LINK up
iptables -w 5 -t nat -A PREROUTING -i LINK -d "$holder" -p udp --dport 53 \
  -j DNAT --to-destination "127.0.0.11:$udp"
iptables -w 5 -t nat -A PREROUTING -i LINK -d "$holder" -p tcp --dport 53 \
  -j DNAT --to-destination "127.0.0.11:$tcp"
iptables -w 5 -t nat -A PREROUTING -i eth0 -p tcp -j DNAT --to-destination "$sandbox"
iptables -w 5 -t nat -A PREROUTING -i eth0 -p udp -j DNAT --to-destination "$sandbox"
iptables -w 5 -t nat -A POSTROUTING -s "$sandbox" -o eth0 -j MASQUERADE
""".replace("LINK", LINK)

# In the net container (NET_ADMIN in its own namespace only): the sandbox's end of the
# link, and its resolv.conf (the sandbox shares the file) naming the holder's end.
_ADDRESS = r"""
set -e
ip addr replace "$1/30" dev eth0
ip link set eth0 up
ip route replace default via "$2"
{ echo "nameserver $2"; grep -v '^nameserver' /etc/resolv.conf || true; } > /tmp/resolv
cat /tmp/resolv > /etc/resolv.conf
rm -f /tmp/resolv
"""


async def start_net(
    engine: Engine,
    owned: AsyncExitStack,
    sid: str,
    holder: dict[str, Any],
    labels: dict[str, str],
    *,
    image: str,
    command: list[str],
    extra_hosts: dict[str, str],
) -> str:
    """The net container of session `sid` (corral's `image` running `command`, which ends
    with the session), linked to `holder` (inspected) and started; returns its id. The
    holder's rules must be in force: the link comes up under them."""
    name = net_name(sid)
    owned.push_async_callback(remove_container, engine, name, sid)
    host_config = engine.api.create_host_config(
        network_mode="none",
        pid_mode=f"container:{holder['Id']}",
        cap_drop=["ALL"],
        cap_add=["NET_ADMIN"],  # in its own namespace: the sandbox's end of the link
        security_opt=["no-new-privileges"],
        auto_remove=True,  # and it ends with the holder's PID namespace
        extra_hosts=extra_hosts or None,
    )
    try:
        await engine.call(
            engine.api.create_container,
            image,
            command,
            name=name,
            labels={**labels, ROLE: "net"},
            host_config=host_config,
        )
        await engine.call(engine.api.start, name)
        info: dict[str, Any] = await engine.idempotent(engine.api.inspect_container, name)
    except APIError as exc:
        raise ProviderError(f"starting the sandbox's net container failed: {exc}") from None
    linked = await run_own(
        engine, holder["Id"], ["sh", "-c", _LINK, "sh", str(HOLDER_SIDE), str(SANDBOX_SIDE)]
    )
    if linked.returncode != 0:
        raise ProviderError(
            f"linking the sandbox's namespace to the holder failed: {linked.stderr.strip()[-300:]}"
            " (does the holder image have iproute2? rebuild it)"
        )
    await address(engine, info["Id"])
    return str(info["Id"])


async def address(engine: Engine, net: str) -> None:
    """The sandbox's end of the link addressed and routed, in net container `net`: before
    each start of the sandbox, since gVisor takes the addresses it finds for its own stack
    and leaves the interface without them."""
    addressed = await run_own(
        engine, net, ["sh", "-c", _ADDRESS, "sh", str(SANDBOX_SIDE), str(HOLDER_SIDE)]
    )
    if addressed.returncode != 0:
        raise ProviderError(
            f"addressing the sandbox's end of the link failed: {addressed.stderr.strip()[-300:]}"
        )
