"""The escape catalogue: named ways a root agent tries to get out of its network policy,
to put its own code where corral runs its programs inside the sandbox, or to write the
channels between those programs and the harness (`forge_through_the_relay`,
`flood_the_shell_status`: scenarios with a persistent shell, not techniques).

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

import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import anyio

from corral.core.session import EnvironmentSession, ExecResult
from corral.core.shell import STATUS_BUDGET, Shell
from corral.errors import ProviderError


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


#: opens stdin and stdout of every corral-exec (the exec channel's helper, the process
#: relay and manager) through /proc: the frames corral reads are on them. Exits 0 if one
#: opened, or if there was no corral-exec to try (the exec runs through the channel's).
_OPEN_HELPER_STDIO = _py(
    "import os\n"
    "found=opened=0\n"
    "for p in filter(str.isdigit,os.listdir('/proc')):\n"
    " try:\n  argv0=open(f'/proc/{p}/cmdline','rb').read().split(bytes(1))[0]\n"
    " except OSError:\n  continue\n"
    " if not argv0.endswith(b'corral-exec'):\n  continue\n"
    " found+=1\n"
    " for fd,mode in ((0,os.O_RDONLY),(1,os.O_WRONLY)):\n"
    "  try:\n   os.close(os.open(f'/proc/{p}/fd/{fd}',mode));opened+=1;print('opened',p,fd)\n"
    "  except OSError as e:\n   print(p,fd,e)\n"
    "print('corral-exec processes:',found)\n"
    "raise SystemExit(0 if opened or not found else 1)\n"
)


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
        # Security round 4: the channels between corral's programs and the harness.
        Technique("open-corral-exec-stdio", _OPEN_HELPER_STDIO),
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


#: what root writes into the process relay's stdout: output frames (`link.frame`: u32
#: length, kind, u32 id) for every id a fresh link has used, each one atomic pipe write,
#: then `FLOOD_MIB` MiB more of them
FORGED = b"FORGED-BY-THE-WORKLOAD\n"
FLOOD_MIB = 64
_FORGE_THE_RELAY = _py(
    "import os,struct\n"
    f"forged={FORGED!r}\n"
    "def f(rid,data): return struct.pack('>IBI',5+len(data),111,rid)+data\n"
    "relays=[]\n"
    "for p in filter(str.isdigit,os.listdir('/proc')):\n"
    " try:\n  argv=open(f'/proc/{p}/cmdline','rb').read().split(bytes(1))\n"
    " except OSError:\n  continue\n"
    " if argv[0].endswith(b'corral-exec') and argv[1:2]==[b'--procs']:\n  relays.append(p)\n"
    "print('relays:',relays)\n"
    "for p in relays:\n"
    " try:\n  fd=os.open(f'/proc/{p}/fd/1',os.O_WRONLY)\n"
    " except OSError as e:\n  print(p,e);continue\n"
    " print('opened',p,flush=True)\n"
    " for rid in range(1,64):\n  os.write(fd,f(rid,forged))\n"
    " chunk=f(2,bytes(4000))\n"
    f" for _ in range({FLOOD_MIB}*1024*1024//len(chunk)):\n  os.write(fd,chunk)\n"
    " raise SystemExit(0)\n"
    "raise SystemExit(1 if relays else 2)\n"
)


async def forge_through_the_relay(session: EnvironmentSession) -> str | None:
    """Root writes forged output frames into the process relay's stdout
    (`/proc/<relay>/fd/1`) while a persistent shell idles, then the harness runs `echo
    after` in that shell. What went wrong, or None: the relay's stdout would not open,
    or the link ended with an error; never the workload's bytes as the shell's."""
    before = rss_mib()
    async with await session.shell() as shell:
        await shell.run("true")
        attack = await session.exec(["sh", "-c", _FORGE_THE_RELAY], timeout=120)
        said = (attack.stdout + attack.stderr).strip()[-300:]
        if attack.returncode == 2:
            return f"no process relay to attack: {said}"
        try:
            after = await shell.run("echo after", timeout=60)
        except ProviderError as exc:  # the link ended with an error: fails closed
            return None if attack.returncode == 0 else f"the link broke unattacked: {exc}"
    if after.stdout != "after\n":
        return f"the shell's result was forged: {after.stdout[:200]!r} ({said})"
    grown = rss_mib() - before
    return f"the harness grew by {grown:.0f} MiB" if grown > FLOOD_RSS_BOUND_MIB else None


def _status_flood(byte: str) -> str:
    """Run in a persistent shell: writes `FLOOD_MIB` MiB of `byte` into every pipe its
    shell holds on a descriptor of 3 or more: the status fd, which the shell keeps on a
    high descriptor while the command runs without it."""
    return _py(
        "import os\n"
        "shell=os.getppid();chunk=" + repr(byte) + ".encode()*65536\n"
        "fds=[int(n) for n in os.listdir(f'/proc/{shell}/fd') if int(n)>=3]\n"
        "pipes=[n for n in fds if os.readlink(f'/proc/{shell}/fd/{n}').startswith('pipe:')]\n"
        "print('pipes:',pipes,flush=True)\n"
        "outs=[os.open(f'/proc/{shell}/fd/{n}',os.O_WRONLY) for n in pipes]\n"
        f"for _ in range({FLOOD_MIB}*16):\n"
        " for fd in outs:\n  os.write(fd,chunk)\n"
    )


#: MiB the harness may grow by while a sandbox floods a channel with `FLOOD_MIB`
FLOOD_RSS_BOUND_MIB = 48
#: seconds another session's `exec("true")` may take while one floods
FLOOD_EXEC_BOUND_S = 1.0
#: seconds a flooded shell's run may take to fail
FLOOD_FAIL_BOUND_S = 30.0


@dataclass(frozen=True)
class Flood:
    """What a status flood did: the error its run failed with (or what happened
    instead), how long that took, the slowest `exec("true")` another session made
    meanwhile, and how much the harness grew."""

    said: str
    took_s: float
    slowest_exec_s: float
    grown_mib: float

    def wrong(self) -> str | None:
        """Which bound the flood broke, or None."""
        if f"(STATUS_BUDGET: {STATUS_BUDGET} bytes a run" not in self.said:
            return f"the run did not fail closed naming the budget: {self.said}"
        if self.took_s > FLOOD_FAIL_BOUND_S:
            return f"the run failed only after {self.took_s:.1f} s"
        if self.slowest_exec_s > FLOOD_EXEC_BOUND_S:
            return f"another session's exec took {self.slowest_exec_s:.2f} s"
        if self.grown_mib > FLOOD_RSS_BOUND_MIB:
            return f"the harness grew by {self.grown_mib:.0f} MiB"
        return None


def rss_mib() -> float:
    """The harness's resident memory, in MiB."""
    with Path("/proc/self/status").open() as status:
        line = next(x for x in status if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


async def flood_the_shell_status(
    session: EnvironmentSession, other: EnvironmentSession, newlines: bool
) -> Flood:
    """A command in a persistent shell of `session` floods its shell's status pipe
    (newlines, or bytes without one) while `other` runs `exec("true")` in a loop. The
    run must fail closed with an error naming the budget; `other` must not notice."""
    slowest = 0.0

    async def busy() -> None:
        nonlocal slowest
        while True:
            start = time.monotonic()
            await other.exec(["true"])
            slowest = max(slowest, time.monotonic() - start)

    await other.exec(["true"])  # its exec channel is up before the timing starts
    before, said, took = rss_mib(), "", 0.0
    async with await session.shell() as shell, anyio.create_task_group() as tasks:
        tasks.start_soon(busy)
        start = time.monotonic()
        said = await _failure(shell, _status_flood("\n" if newlines else "x"))
        took = time.monotonic() - start
        tasks.cancel_scope.cancel()
    return Flood(said, took, slowest, rss_mib() - before)


async def _failure(shell: Shell, command: str) -> str:
    """The error `command` fails with in `shell`, or what it did instead."""
    try:
        result = await shell.run(command, timeout=120)
    except ProviderError as exc:
        return str(exc)
    return f"the run did not fail: {result.returncode} {result.stdout[-200:]!r}"
