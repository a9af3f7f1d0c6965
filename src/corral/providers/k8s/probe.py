"""The `corral-probe` container: corral's own binaries in the Pod's network namespace.

What dials the policy probe and what sends corral's DNS queries must be out of the
workload's reach: the sandbox container's `nc`, `/etc/hosts` and libc are root's to
replace, and a probe run with them can be made to read "refused" whatever the CNI does.
So every sandbox Pod carries a second container from corral's own image (`probe_image`).
It shares the Pod's network namespace and nothing else the workload can write (no process
namespace, its own root filesystem, read-only; the one volume it mounts is corral's
programs, read-only to the sandbox: see `pod.PROGRAMS`), runs as `nobody` with no
capabilities, and corral execs into it. A container in the spec, rather than an ephemeral
one per probe: an exec into a running container costs tens of milliseconds, an ephemeral
container a container start each time, and each one stays in the Pod's spec for good.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
from collections.abc import Sequence
from typing import Any

import anyio

from corral.errors import NetworkPolicyNotEnforced, ProviderError
from corral.network.targets import IPAddress
from corral.providers.k8s.config import KubernetesConfig
from corral.providers.k8s.execution import Target, run_own

CONTAINER = "corral-probe"
_NOBODY = 65534
#: Loopback listener ports for the positive control: below the usual ephemeral range, so
#: they never collide with the source port of a connection the Pod has open.
_CONTROL_PORTS = (20000, 32000)

# $1: control port, $2 $3: the destination. `dial` succeeds only if nc connected and ran
# its -e program (which prints the token and closes, so a server that never closes cannot
# hang it). A failed dial means "refused" only if the same `dial` reaches a listener of
# its own on loopback right after: a dialler that cannot connect at all (no ports left,
# no nc) proves nothing, and says so. busybox connects blocking, so where the CNI rejects
# with ICMP (kube-router) the refusal shows at the first SYN retransmit, about 1 s.
DIAL_SCRIPT = (
    'busybox nc -l -p "$1" </dev/null >/dev/null 2>&1 & listener=$!; '
    'dial() { busybox nc -w 2 "$1" "$2" -e sh -c \'echo corral-dial-open >&2\' '
    "</dev/null 2>&1 | busybox grep -qx corral-dial-open; }; "
    'if dial "$2" "$3"; then seen=connected; else seen=refused; fi; control=failed; '
    "for _ in 1 2 3 4 5 6 7 8 9 10; do "
    'if dial 127.0.0.1 "$1"; then control=ok; break; fi; busybox usleep 100000; done; '
    'kill "$listener" 2>/dev/null; '
    'if [ "$control" = ok ]; then echo "$seen"; else echo control-failed; fi'
)


#: corral's own containers in the Pod (the probe, the programs' init container)
SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "runAsUser": _NOBODY,
    "runAsGroup": _NOBODY,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
RESOURCES: dict[str, Any] = {
    "requests": {"cpu": "10m", "memory": "16Mi"},
    "limits": {"memory": "64Mi"},
}


def container(cfg: KubernetesConfig, volume: str, mount: str) -> dict[str, Any]:
    """The probe container's spec: the image's own entrypoint keeps it running; corral's
    programs `volume` writable at `mount` (the exec channel puts its helper there)."""
    return {
        "name": CONTAINER,
        "image": cfg.probe_image,
        "imagePullPolicy": cfg.image_pull_policy,
        "securityContext": SECURITY_CONTEXT,
        "resources": RESOURCES,
        "volumeMounts": [{"name": volume, "mountPath": mount}],
    }


async def run(target: Target, argv: list[str], stdin: bytes | None = None) -> str:
    """Run `argv` in the probe container; its stdout, or ProviderError if it failed."""
    result = await run_own(target, argv, stdin=stdin)
    if result.returncode != 0:
        detail = result.stderr.strip()[-300:] or f"exit {result.returncode}"
        raise ProviderError(
            f"the {CONTAINER} container of Pod {target.pod} could not run {argv[0]!r} "
            f"({detail}); probe_image must provide sh and busybox (nc, grep, usleep, xxd)"
        )
    return result.stdout


async def dial(target: Target, host: str, port: int, dialler: str | None = None) -> bool:
    """Whether a TCP connection to `host:port` opens from the Pod's network namespace,
    dialled by corral's helper at `dialler` (`--probe-dial`: an ICMP refusal ends it at
    once) or, without one, by DIAL_SCRIPT.

    Fails closed: when the positive control does not connect, or the output is anything
    but the dialler's own verdict, this raises instead of answering.
    """
    (control,) = _control_ports(1)
    return await _dial(target, host, port, dialler, control)


async def dial_each(
    target: Target, destinations: Sequence[tuple[IPAddress, int]], dialler: str | None
) -> list[bool]:
    """`dial` for each destination, all at once (each with a control port of its own);
    the first failure is raised as itself, the other dials cancelled."""
    seen = [False] * len(destinations)
    failures: list[Exception] = []

    async with anyio.create_task_group() as tg:

        async def one(index: int, host: IPAddress, port: int, control: int) -> None:
            try:
                seen[index] = await _dial(target, str(host), port, dialler, control)
            except Exception as exc:  # raised as itself below, not in the group's ExceptionGroup
                failures.append(exc)
                tg.cancel_scope.cancel()

        controls = _control_ports(len(destinations))
        for index, ((host, port), control) in enumerate(zip(destinations, controls, strict=True)):
            tg.start_soon(one, index, host, port, control)
    if failures:
        raise failures[0]
    return seen


def _control_ports(count: int) -> list[int]:
    return secrets.SystemRandom().sample(range(*_CONTROL_PORTS), count)


async def _dial(target: Target, host: str, port: int, dialler: str | None, control: int) -> bool:
    if dialler is not None:
        argv = [dialler, "--probe-dial", str(control), host, str(port)]
    else:
        argv = ["sh", "-c", DIAL_SCRIPT, "sh", str(control), host, str(port)]
    return verdict(await run(target, argv), target.pod)


def verdict(output: str, pod: str) -> bool:
    """DIAL_SCRIPT's answer: connected or refused; anything else raises ProviderError."""
    seen = output.strip()
    if seen == "connected":
        return True
    if seen == "refused":
        return False
    why = "its positive control could not connect" if seen == "control-failed" else repr(seen)
    raise ProviderError(f"could not probe the policy from Pod {pod}: {why}")


#: The kernel's word on the Pod's network namespace, read in the probe container (the
#: sandbox can change neither without CAP_NET_ADMIN): which links hold an IPv6 address,
#: and the link-layer addresses of the neighbours each has reached.
IPV6_STATE = "busybox cat /proc/net/if_inet6; echo --; busybox cat /proc/net/arp"
#: lines of IPV6_STATE read, at most (a Pod has a handful of links and neighbours)
_STATE_LINES = 256
_ARP_COMPLETE = 0x2
_HEX = re.compile(r"0x[0-9a-fA-F]{1,8}")
_LINK_LOCAL_PREFIX = b"\xfe\x80" + bytes(6)


async def ipv6_destinations(
    target: Target, nodes: Sequence[IPAddress], port: int
) -> list[tuple[IPAddress, int]]:
    """Where the node answers over IPv6 from the Pod, on `port`: none when IPv6 is off."""
    return ipv6_plan(await run(target, ["sh", "-c", IPV6_STATE]), nodes, port, target.pod)


def ipv6_plan(
    state: str, nodes: Sequence[IPAddress], port: int, pod: str
) -> list[tuple[IPAddress, int]]:
    """What the probe dials over IPv6, from IPV6_STATE's output: nothing when no link but
    loopback holds an IPv6 address; else the link-local address each neighbour the Pod
    reached over IPv4 derives from its MAC (as an agent would, EUI-64) and the node's own
    IPv6 addresses, all on `port`. IPv6 on with nothing to dial cannot be shown policed:
    NetworkPolicyNotEnforced."""
    lines = state.splitlines()[:_STATE_LINES]
    if "--" not in lines:
        raise ProviderError(f"the probe's read of Pod {pod}'s IPv6 state is cut: {state[-200:]!r}")
    split = lines.index("--")
    links = _ipv6_links(lines[:split])
    if not links:
        return []
    found: list[tuple[IPAddress, int]] = []
    for link, mac in _neighbours(lines[split + 2 :]):
        if link in links and (destination := (_link_local(mac, link), port)) not in found:
            found.append(destination)
    found += [(node, port) for node in nodes if node.version == 6]
    if not found:
        raise NetworkPolicyNotEnforced(
            f"IPv6 is on in Pod {pod} (links {', '.join(sorted(links))}) and the probe found "
            "no address of the node to dial over it, so no policy can be shown to hold over "
            "IPv6; keep disable_ipv6=True"
        )
    return found


def _ipv6_links(if_inet6: list[str]) -> set[str]:
    """The links but loopback that hold an IPv6 address: /proc/net/if_inet6's lines are
    the address (32 hex digits), four hex fields, and the link."""
    links: set[str] = set()
    for line in if_inet6:
        fields = line.split()
        if len(fields) == 6 and len(fields[0]) == 32 and fields[5] != "lo":
            links.add(fields[5])
    return links


def _neighbours(arp: list[str]) -> list[tuple[str, str]]:
    """(link, MAC) of each resolved entry of /proc/net/arp's lines after its header: IP
    address, HW type, flags, HW address, mask, device."""
    found: list[tuple[str, str]] = []
    for line in arp:
        fields = line.split()
        flags = int(fields[2], 16) if len(fields) == 6 and _HEX.fullmatch(fields[2]) else 0
        if flags & _ARP_COMPLETE and len(fields[3]) == 17:
            found.append((fields[5], fields[3]))
    return found


def _link_local(mac: str, link: str) -> IPAddress:
    """The EUI-64 link-local address of `mac` (aa:bb:cc:dd:ee:ff), on `link`."""
    octets = bytes.fromhex(mac.replace(":", ""))
    eui = bytes([octets[0] ^ 0x02]) + octets[1:3] + b"\xff\xfe" + octets[3:]
    address = ipaddress.IPv6Address(_LINK_LOCAL_PREFIX + eui)
    return ipaddress.ip_address(f"{address}%{link}")
