"""The escape catalogue: named ways a root agent tries to get out of its network policy,
or to put its own code where corral runs its programs inside the sandbox.

Each technique is a shell script run as root inside a sandbox whose policy forbids the
`denied` destinations. It exits 0 only if it got a byte-level answer from a place the
policy forbids (or changed what enforces the policy), so "escaped" is a fact measured in
the sandbox, not the absence of an error. Dialling techniques first prove, under
`public`, that they can reach their target at all (`control=True`), so a technique that
is merely broken never reads as "blocked".

Never run these on the host: they flush firewalls and replace routes where they can.
Needs in the image: sh, python3, and for some techniques ip, iptables, ping, unshare,
getent (the test images have them; a missing tool counts as blocked for that technique,
which the control run exposes for the dialling ones).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from corral.core.session import EnvironmentSession, ExecResult


class EscapeTargets(NamedTuple):
    """Where the techniques aim: all forbidden by the policy under test."""

    denied_ip: str
    denied_ip6: str
    port: int
    port6: int
    udp_port: int
    #: a link-local address (169.254.0.0/16, like a cloud metadata service) the test owns
    link_local_ip: str
    link_local_port: int
    #: the sandbox's gateway or node address, with a port a host service listens on
    host_ip: str
    host_port: int
    #: another sandbox's address and a port it listens on
    peer_ip: str
    peer_port: int
    #: the sandbox's resolver
    resolver: str
    #: the runtime gives the sandbox a kernel of its own (gVisor): see `escapes`
    own_kernel: bool = False


@dataclass(frozen=True)
class Technique:
    name: str
    script: str
    control: bool = False
    #: writes a network setting of the kernel the sandbox runs on
    kernel_setting: bool = False


def _py(code: str) -> str:
    """A python3 one-liner that survives nesting in any shell quoting (digits only)."""
    return f"python3 -c 'exec(bytes([{','.join(str(b) for b in code.encode())}]))'"


def _tcp(host: str, port: int, family: str = "AF_INET", setup: str = "") -> str:
    """Exits 0 iff the TCP handshake with host:port completes."""
    return _py(
        "import socket,sys\n"
        f"s=socket.socket(socket.{family},socket.SOCK_STREAM);s.settimeout(3)\n{setup}"
        f"try:\n s.connect(({host!r},{port}))\nexcept OSError as e:\n print(e);sys.exit(1)\n"
    )


def _udp(host: str, port: int, setup: str = "", payload: str = 'b"hi"') -> str:
    """Exits 0 iff a datagram to host:port is answered."""
    return _py(
        "import socket,sys\n"
        f"s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.settimeout(2)\n{setup}"
        f"s.sendto({payload},({host!r},{port}))\n"
        "try:\n sys.exit(0 if s.recv(512) else 1)\nexcept OSError as e:\n print(e);sys.exit(1)\n"
    )


_PTRACE_OUTSIDE = _py(
    # Any process of another mount namespace (a holder, another container) that is
    # visible and attachable would be a way to act outside the sandbox.
    "import ctypes,os,sys\n"
    "l=ctypes.CDLL(None,use_errno=True);me=os.readlink('/proc/self/ns/mnt')\n"
    "for p in filter(str.isdigit,os.listdir('/proc')):\n"
    " try:\n  ns=os.readlink(f'/proc/{p}/ns/mnt')\n except OSError:\n  continue\n"
    " if ns!=me and l.ptrace(16,int(p),0,0)==0:\n  sys.exit(0)\n"
    "sys.exit(1)\n"
)


def _link_local_gateway(port: int) -> str:
    return _py(
        "import socket,subprocess,sys\n"
        "r=subprocess.run(['ip','-6','route','show','default'],capture_output=True,text=True)\n"
        "w=r.stdout.split()\n"
        "if 'via' not in w or 'dev' not in w: sys.exit(1)\n"
        "gw=w[w.index('via')+1];dev=w[w.index('dev')+1]\n"
        "s=socket.socket(socket.AF_INET6,socket.SOCK_STREAM);s.settimeout(3)\n"
        f"try:\n s.connect((gw+'%'+dev,{port}))\nexcept OSError as e:\n print(e);sys.exit(1)\n"
    )


#: corral's read-only programs in the sandbox (Docker and Kubernetes); their absence counts
#: as an escape, so a sandbox without them can never read as "blocked".
PROGRAMS = "/.corral"
_PROGRAMS_THERE = f'[ -x {PROGRAMS}/busybox ] || {{ echo "no {PROGRAMS}/busybox"; exit 0; }}; '


def _own_programs() -> list[Technique]:
    """Ways to put the agent's code where corral runs its own (security round 3)."""
    replace = (
        f'for f in {PROGRAMS}/*; do cp /bin/true "$f" 2>/dev/null && exit 0; '
        f'mv -f /bin/true "$f" 2>/dev/null && exit 0; done; exit 1'
    )
    return [
        Technique("replace-corral-programs", _PROGRAMS_THERE + replace),
        Technique(
            "remount-corral-programs-rw",
            _PROGRAMS_THERE + f"mount -o remount,rw {PROGRAMS} && touch {PROGRAMS}/x",
        ),
        Technique(
            "unmount-corral-programs",
            _PROGRAMS_THERE + f"umount -l {PROGRAMS} && [ ! -x {PROGRAMS}/busybox ]",
        ),
        Technique(
            "cover-corral-programs",
            _PROGRAMS_THERE + f"mount -t tmpfs none {PROGRAMS} && touch {PROGRAMS}/x",
        ),
        Technique(
            "rename-corral-programs",
            _PROGRAMS_THERE + f"mv {PROGRAMS} /corral-moved && mkdir {PROGRAMS}",
        ),
    ]


def catalogue(t: EscapeTargets) -> list[Technique]:
    """Every technique; those aimed at IPv6 only when `t.denied_ip6` is set (a provider
    whose sandboxes have no IPv6 address cannot be tried over it)."""
    dial = _tcp(t.denied_ip, t.port)
    techniques = [
        Technique("tcp-direct", dial, control=True),
        Technique("udp-direct", _udp(t.denied_ip, t.udp_port), control=True),
        Technique("icmp-ping", f"ping -c 1 -W 2 {t.denied_ip}", control=True),
        Technique("tcp-ipv6", _tcp(t.denied_ip6, t.port6, "AF_INET6"), control=True),
        Technique(
            "tcp-v4-mapped-ipv6", _tcp(f"::ffff:{t.denied_ip}", t.port, "AF_INET6"), control=True
        ),
        Technique(
            "tcp-source-port-53", _tcp(t.denied_ip, t.port, setup="s.bind(('0.0.0.0',53))\n")
        ),
        Technique(
            "udp-source-port-53", _udp(t.denied_ip, t.udp_port, setup="s.bind(('0.0.0.0',53))\n")
        ),
        Technique("gateway-host-port", _tcp(t.host_ip, t.host_port), control=True),
        # Sandboxes never reach each other, whatever the policy: no control run.
        Technique("other-sandbox", _tcp(t.peer_ip, t.peer_port)),
        Technique(
            "link-local-metadata-style", _tcp(t.link_local_ip, t.link_local_port), control=True
        ),
        Technique(
            "dns-query-through-resolver",
            "getent hosts escape-$(date +%s).corral.test >/dev/null || "
            + _udp(t.resolver, 53, payload="bytes(12)"),
        ),
        Technique("dns-tcp-to-resolver", _tcp(t.resolver, 53)),
        Technique(
            "iptables-flush-nft", f"iptables-nft -F && iptables-nft -P OUTPUT ACCEPT; {dial}"
        ),
        Technique(
            "iptables-flush-legacy",
            f"iptables-legacy -F && iptables-legacy -P OUTPUT ACCEPT; {dial}",
        ),
        Technique("ip6tables-flush", "ip6tables -F && " + _tcp(t.denied_ip6, t.port6, "AF_INET6")),
        Technique(
            "iptables-restore-empty",
            f"printf '*filter\\n:OUTPUT ACCEPT [0:0]\\nCOMMIT\\n' | iptables-restore; {dial}",
        ),
        Technique(
            "raw-socket", _py("import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 6)")
        ),
        Technique(
            "packet-socket", _py("import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)")
        ),
        Technique("new-network-namespace", f'unshare --net sh -c "ip link set lo up; {dial}"'),
        Technique(
            "new-user-and-network-namespace",
            f'unshare --user --map-root-user --net sh -c "ip link set lo up; {dial}"',
        ),
        Technique("route-change", f"ip route replace default dev lo && {dial}"),
        Technique("link-change", "ip link add corral-esc type dummy"),
        Technique("address-change", f"ip addr add {t.denied_ip}/32 dev lo && {dial}"),
        Technique("ipv6-link-local-gateway", _link_local_gateway(t.host_port)),
        Technique(
            "proc-sys-ip-forward", "echo 1 > /proc/sys/net/ipv4/ip_forward", kernel_setting=True
        ),
        Technique(
            "proc-sys-route-localnet",
            "echo 1 > /proc/sys/net/ipv4/conf/all/route_localnet",
            kernel_setting=True,
        ),
        Technique("sys-class-net-write", "echo 1 > /sys/class/net/lo/flags"),
        Technique("remount-sys-rw", "mount -o remount,rw /sys"),
        Technique("ptrace-outside-processes", _PTRACE_OUTSIDE),
        Technique("nsenter-init", f'nsenter --target 1 --net --mount sh -c "{dial}"'),
        Technique("docker-socket", "test -S /var/run/docker.sock || test -S /run/docker.sock"),
        *_own_programs(),
    ]
    if t.denied_ip6:
        return techniques
    return [x for x in techniques if x.name not in _IPV6_ONLY]


_IPV6_ONLY = frozenset({"tcp-ipv6", "ip6tables-flush", "ipv6-link-local-gateway"})


async def attempt(session: EnvironmentSession, technique: Technique) -> ExecResult:
    """Run one technique in the sandbox (as its default user: root in the catalogue's
    sandboxes); exit status 0 means it escaped."""
    return await session.exec(["sh", "-c", technique.script], timeout=30)


async def escapes(session: EnvironmentSession, targets: EscapeTargets) -> dict[str, str]:
    """Every technique that got out, with what it printed; empty when all were stopped.

    With `targets.own_kernel` the sandbox's network settings belong to its own kernel
    (gVisor's netstack), which nothing that enforces the policy depends on: root may
    change them. So those techniques run first, uncounted, and every other one must
    still be stopped with the settings changed."""
    escaped: dict[str, str] = {}
    techniques = catalogue(targets)
    if targets.own_kernel:
        for technique in [t for t in techniques if t.kernel_setting]:
            await attempt(session, technique)
        techniques = [t for t in techniques if not t.kernel_setting]
    for technique in techniques:
        result = await attempt(session, technique)
        if result.returncode == 0:
            escaped[technique.name] = (result.stdout + result.stderr).strip()[-300:]
    return escaped


async def failed_controls(session: EnvironmentSession, targets: EscapeTargets) -> dict[str, str]:
    """Under `public`: the dialling techniques that could not reach their target at all."""
    failed: dict[str, str] = {}
    for technique in catalogue(targets):
        if technique.control:
            result = await attempt(session, technique)
            if result.returncode != 0:
                failed[technique.name] = (result.stdout + result.stderr).strip()[-300:]
    return failed
