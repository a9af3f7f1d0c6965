"""Applying a policy through the holder: resolve, render, one restore per family, probe.

Everything runs in one exec in the holder, which owns the sandbox's network namespace and
alone has NET_ADMIN. If the IPv6 restore fails after the IPv4 one succeeded, the saved
IPv4 table is restored, so the old policy stays whole.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from docker.errors import APIError

from corral.core.tarsafe import owned_by_root
from corral.errors import NetworkPolicyNotEnforced, ProviderError
from corral.helper import helper_binary, no_helper
from corral.network.dns import Answer, resolve_names
from corral.network.events import EventLog, phase_in_rules
from corral.network.gate import GATE_CHAIN
from corral.network.iptables import CHAIN, Endpoint, IptablesPayload, render_iptables
from corral.network.link import LINK
from corral.network.policy import NetworkPolicy, Phase
from corral.network.policy_record import PolicyRecord, read_record
from corral.network.probe import DISCARD_PORT, forbidden_probe
from corral.network.resolve import Resolution, parse_resolv_conf, resolve_policy
from corral.network.targets import EntryType, IPAddress
from corral.network.wildcard import (
    RESOLVER,
    UPSTREAM_MARK,
    NameSets,
    refuse_all_config,
    uses_resolver,
)
from corral.providers.docker import programs
from corral.providers.docker.engine import Engine, Raw
from corral.providers.docker.execution import run_own

#: corral's resolver for allowlists that name hosts (`network.wildcard`), in the holder's
#: own filesystem: the helper binary, its config, `loaded` and `pid` (see helper/dns.go).
DNS_DIR = "/.corral-dns"
_DNS = r"""
D=/.corral-dns
dns_pid() {
  p=$(cat "$D/pid" 2>/dev/null) || return 1
  grep -qa -- --dns "/proc/$p/cmdline" 2>/dev/null && echo "$p"
}
drop_sets() { # keep: the generation whose sets stay
  for s in $(ipset list -n 2>/dev/null); do
    case "$s" in
      corral-"$1"-*) ;;
      corral-*) ipset destroy "$s" || echo "destroying $s failed" >&2 ;;
    esac
  done
}
dns_undo() {
  [ -n "$CORRAL_DNS_GEN" ] || return 0
  if [ -e "$D/config.prev" ]; then
    mv "$D/config.prev" "$D/config.json"
    p=$(dns_pid) && kill -HUP "$p"
  fi
  for s in $(ipset list -n 2>/dev/null); do
    case "$s" in corral-"$CORRAL_DNS_GEN"-*) ipset destroy "$s" 2>/dev/null ;; esac
  done
}
dns_prepare() {
  [ -n "$CORRAL_DNS_GEN" ] || return 0
  if [ -z "$CORRAL_DNS_SETS" ] && [ -z "$CORRAL_DNS_START" ] && [ ! -e "$D/pid" ]; then
    CORRAL_DNS_GEN=; return 0  # no hostname now, and corral's resolver never ran here
  fi
  if [ -n "$CORRAL_DNS_SETS" ] || [ -n "$CORRAL_DNS_START" ]; then
    [ -x "$D/resolver" ] || { echo 'corral-dns: no resolver binary' >&2; exit 7; }
  fi
  if [ -n "$CORRAL_DNS_SETS" ]; then
    printf '%s' "$CORRAL_DNS_SETS" | ipset -exist restore \
      || { echo 'creating the ipsets failed (has the holder image ipset?)' >&2; dns_undo; exit 5; }
  fi
  rm -f "$D/config.prev"
  [ -e "$D/config.json" ] && cp "$D/config.json" "$D/config.prev"
  printf '%s' "$CORRAL_DNS_CONFIG" > "$D/config.tmp" && mv "$D/config.tmp" "$D/config.json"
  if p=$(dns_pid); then
    kill -HUP "$p"
  elif [ -n "$CORRAL_DNS_SETS" ] || [ -n "$CORRAL_DNS_START" ]; then
    rm -f "$D/loaded"
    setsid "$D/resolver" --dns "$D" </dev/null >>"$D/log" 2>&1 &
  else
    return 0
  fi
  i=0
  while [ "$(cat "$D/loaded" 2>/dev/null)" != "$CORRAL_DNS_GEN" ]; do
    i=$((i + 1))
    if [ $i -gt 100 ]; then
      echo "corral's resolver did not take its configuration:" \
        "$(cat "$D/loaded" 2>/dev/null) $(tail -c 300 "$D/log" 2>/dev/null)" >&2
      dns_undo; exit 6
    fi
    sleep 0.05
  done
}
dns_finish() {
  [ -n "$CORRAL_DNS_GEN" ] || return 0
  rm -f "$D/config.prev"
  drop_sets "$CORRAL_DNS_GEN"
  # The sandbox shares this file: it points there at corral's resolver or the network's.
  # Only a convenience: the rules, not this file, decide what resolves.
  awk -v ns="$CORRAL_DNS_NAMESERVERS" '
    BEGIN {n = split(ns, a, " "); for (i = 1; i <= n; i++) print "nameserver " a[i]}
    $1 != "nameserver"' /etc/resolv.conf > "$D/resolv.tmp" \
    && cat "$D/resolv.tmp" > /etc/resolv.conf
}
"""
_APPLY = (
    _DNS
    + r"""
dns_prepare
# The name gate's DNATs (only where corral's resolver runs, or ran: it is the gate).
if [ -n "$CORRAL_DNS_GEN" ]; then
  if ! printf '%s' "$CORRAL_NAT4" | iptables-restore -w 5 --noflush \
    || ! { iptables -w 5 -t nat -C OUTPUT -j "$CORRAL_GATE" 2>/dev/null \
      || iptables -w 5 -t nat -I OUTPUT 1 -j "$CORRAL_GATE"; } \
    || ! { iptables -w 5 -t nat -C PREROUTING -i "$CORRAL_LINK" -j "$CORRAL_GATE" 2>/dev/null \
      || iptables -w 5 -t nat -I PREROUTING 1 -i "$CORRAL_LINK" -j "$CORRAL_GATE"; }; then
    echo 'the name gate rules (nat) failed' >&2
    iptables -w 5 -t nat -F "$CORRAL_GATE" 2>/dev/null
    dns_undo
    exit 9
  fi
fi
old=$(iptables-save -t filter 2>/dev/null)
if ! printf '%s' "$CORRAL_V4" | iptables-restore -w 5; then
  echo 'iptables-restore failed' >&2
  iptables -w 5 -t nat -F "$CORRAL_GATE" 2>/dev/null
  dns_undo
  exit 3
fi
if ! printf '%s' "$CORRAL_V6" | ip6tables-restore -w 5; then
  echo 'ip6tables-restore failed' >&2
  [ -n "$old" ] && printf '%s\n' "$old" | iptables-restore -w 5
  iptables -w 5 -t nat -F "$CORRAL_GATE" 2>/dev/null
  dns_undo
  exit 4
fi
dns_finish
[ -z "$CORRAL_PROBE_HOST" ] && exit 0
if busybox nc -w 2 "$CORRAL_PROBE_HOST" "$CORRAL_PROBE_PORT" </dev/null >/dev/null 2>&1; then
  echo probe=connected
else
  echo probe=refused
fi
$CORRAL_PROBE_TABLES -w 5 -nvxL "$CORRAL_CHAIN" \
  | awk '$3 == "REJECT" {n += $1} END {print "rejects=" n+0}'
"""
)
#: corral's apply-time lookups for a policy that `uses_resolver`, from the holder: the
#: helper sends corral's queries to upstream server $1 from a socket with mark $2 and
#: prints the answers (as hex). The rules in force may be any policy's (a no-network
#: baseline, another allowlist), so for the length of the call one rule ahead of corral's
#: chain accepts exactly that traffic: TCP to $1 port 53 carrying the mark, which only a
#: holder of NET_ADMIN can set (the sandbox gains nothing from it); the next apply's
#: restore would replace it anyway. Exit 7: the helper is not in the holder yet; 8: the
#: rule could not be added.
_MARKED_QUERY = r"""
D=/.corral-dns
[ -x "$D/resolver" ] || exit 7
server=$1 mark=$2
case "$server" in *:*) t=ip6tables ;; *) t=iptables ;; esac
set -- OUTPUT -d "$server" -p tcp --dport 53 -m mark --mark "$mark" -j ACCEPT
$t -w 5 -I "$@" >&2 || exit 8
trap '$t -w 5 -D "$@" >&2' EXIT
"$D/resolver" --dns-query "$server" "$mark" | busybox xxd -p
"""
_SAVED = "iptables-save -t filter && echo '#corral-ipv6' && ip6tables-save -t filter"
_REJECTS = r"""$1 -w 5 -nvxL "$2" | awk '$3 == "REJECT" {n += $1} END {print n+0}'"""


async def dns_servers(engine: Engine, holder: str) -> tuple[IPAddress, ...]:
    """The network's resolvers, read from the holder before any sandbox joins it."""
    result = await run_own(engine, holder, ["cat", "/etc/resolv.conf"])
    return parse_resolv_conf(result.stdout)


async def resolve_in(
    engine: Engine,
    container: str,
    hosts: Sequence[str],
    *,
    servers: Sequence[IPAddress],
    static: Mapping[str, str],
    marked: bool = False,
) -> dict[str, Answer]:
    """Resolve `hosts` with corral's own queries, sent from `container` (holder image);
    `marked`: by the holder's helper over corral's marked upstream path (`_MARKED_QUERY`),
    which works whatever rules are in force.

    Never through the namespace's /etc/hosts or libc: the sandbox shares those files and
    can rewrite them. The harness's `extra_hosts` come from the config instead.
    """
    if not hosts:
        return {}

    async def run(argv: list[str], stdin: bytes) -> str:
        result = await run_own(engine, container, argv, stdin=stdin)
        if marked and result.returncode == 7:  # the helper is not in the holder yet
            await install_resolver(engine, container)
            result = await run_own(engine, container, argv, stdin=stdin)
        if marked and result.returncode in (7, 8):
            raise ValueError(f"corral's lookup could not run: {result.stderr.strip()[-300:]}")
        if result.stdout_truncated:
            raise ValueError("the DNS answers were longer than corral reads")
        return result.stdout

    try:
        if marked:
            return await resolve_names(
                hosts,
                servers=servers,
                run=run,
                static=static,
                script=_MARKED_QUERY,
                args=(f"{UPSTREAM_MARK:#x}",),
            )
        return await resolve_names(hosts, servers=servers, run=run, static=static)
    except ValueError as exc:
        raise ProviderError(f"resolving {', '.join(hosts)} failed: {exc}") from None


#: the engine's own upstream resolvers, by engine address (read once per process)
_ENGINE_RESOLVERS: dict[str, tuple[IPAddress, ...]] = {}


@dataclass(frozen=True)
class Upstream:
    """Where corral's resolver forwards allowed names, and where corral resolves a policy's
    hostnames when it `uses_resolver`: the configured servers (`upstream_dns_servers`),
    else the engine's own, read once from a container of corral's image on the engine's
    default bridge network (whose resolv.conf the engine fills with the resolvers its
    embedded DNS server forwards to). Docker's embedded server itself cannot be used: it
    forwards from inside the sandbox's namespace, unmarked, like the sandbox would."""

    configured: tuple[IPAddress, ...] | None
    image: str
    labels: dict[str, str] = field(default_factory=dict[str, str])

    async def servers(self, engine: Engine) -> tuple[IPAddress, ...]:
        if self.configured:
            return self.configured
        key = str(engine.api.base_url)
        if key not in _ENGINE_RESOLVERS:
            found = await engine.call(_read_engine_resolvers, engine.api, self.image, self.labels)
            if not found:
                raise ProviderError(
                    "the engine's default bridge network gives no resolver for corral's "
                    "resolver to forward allowlisted names to; set upstream_dns_servers"
                )
            _ENGINE_RESOLVERS[key] = found
        return _ENGINE_RESOLVERS[key]


def _read_engine_resolvers(api: Raw, image: str, labels: dict[str, str]) -> tuple[IPAddress, ...]:
    """The nameservers of a container on the default bridge (blocking)."""
    host_config = api.create_host_config(
        network_mode="bridge", cap_drop=["ALL"], security_opt=["no-new-privileges"]
    )
    name = f"corral-resolvers-{secrets.token_hex(4)}"
    try:
        api.create_container(
            image, ["cat", "/etc/resolv.conf"], name=name, labels=labels, host_config=host_config
        )
        try:
            api.start(name)
            api.wait(name, timeout=30)
            text = api.logs(name, stdout=True, stderr=False).decode(errors="replace")
        finally:
            with contextlib.suppress(APIError):
                api.remove_container(name, force=True)
    except APIError as exc:
        raise ProviderError(
            f"reading the engine's resolvers (for allowlisted hostnames) failed: {exc}; "
            "set upstream_dns_servers"
        ) from None
    return tuple(a for a in parse_resolv_conf(text) if not a.is_loopback)


async def resolve(
    engine: Engine,
    container: str,
    policy: NetworkPolicy,
    *,
    dns: tuple[IPAddress, ...],
    extra_hosts: Mapping[str, str],
    upstream: Upstream | None = None,
) -> Resolution:
    """The policy's hostnames as corral resolves them from `container` (holder image).

    A policy that `uses_resolver` (an allowlist naming hosts) gets fresh sets, and its
    names are asked of the upstream corral's resolver forwards to, over the marked path
    (`container` must be the holder): Docker's embedded resolver, which the others ask,
    forwards from the sandbox's namespace, where such a policy's rules refuse it."""
    hostnames = [t.host for t in policy.targets if t.entry_type is EntryType.HOSTNAME]
    names: NameSets | None = None
    if uses_resolver(policy):
        if upstream is None:
            raise ProviderError(f"policy {policy} names hosts, but no upstream resolver")
        servers = await upstream.servers(engine)
        names = NameSets.fresh(servers)
        answers = await resolve_in(
            engine, container, hostnames, servers=servers, static=extra_hosts, marked=True
        )
    else:
        answers = await resolve_in(engine, container, hostnames, servers=dns, static=extra_hosts)

    async def lookup(host: str) -> tuple[IPAddress, ...]:
        answer = answers.get(host)
        return answer.addresses if answer else ()

    ttls = [a.ttl for a in answers.values() if a.addresses]
    return (await resolve_policy(policy, lookup, dns)).model_copy(
        update={
            "ttl_s": float(min(ttls)) if ttls else (0.0 if answers else None),
            "names": names,
        }
    )


async def apply_policy(
    engine: Engine,
    holder: str,
    policy: NetworkPolicy,
    resolved: Resolution,
    *,
    probe_candidates: list[tuple[IPAddress, int]],
    phase: Phase | None,
    events: EventLog | None = None,
    start_resolver: bool = False,
    endpoints: tuple[Endpoint, ...] = (),
) -> None:
    """Render and apply `policy` in one holder exec, then check it with a probe.

    Refusals and admitted flows are logged stamped with `phase`; the probe's own is taken
    out of `events`.
    A policy that `uses_resolver` (or `start_resolver`: a later phase will, and the
    sandbox does not exist yet) also gets corral's resolver in the holder, started if it
    does not run; any other policy switches a running one to refusing every name.
    `endpoints` are admitted whatever the policy (corral's credential proxy)."""
    payload = render_iptables(policy, resolved, phase=phase, endpoints=endpoints)
    probe = forbidden_probe(policy, resolved, probe_candidates)
    if events is not None:
        if probe is not None:
            events.expect_own(*probe)
        # Before the rules: a flow they admit is listed under the name it was allowed by.
        events.name_addresses(resolved.addresses)
    env = _apply_env(policy, resolved, payload, probe, start_resolver=start_resolver)
    result = await run_own(engine, holder, ["sh", "-c", _APPLY], env)
    if result.returncode == 7:  # corral's resolver is not in this holder yet: nothing changed
        await install_resolver(engine, holder)
        result = await run_own(engine, holder, ["sh", "-c", _APPLY], env)
    if result.returncode != 0:
        raise ProviderError(
            f"applying network policy {policy} failed (exit {result.returncode}): "
            f"{result.stderr.strip()[-500:]}; the previous policy is still in force"
        )
    if probe is not None:
        _judge_probe(policy, probe, result.stdout)


def _apply_env(
    policy: NetworkPolicy,
    resolved: Resolution,
    payload: IptablesPayload,
    probe: tuple[IPAddress, int] | None,
    *,
    start_resolver: bool,
) -> dict[str, str]:
    """What `_APPLY` reads: the payloads, the resolver's generation and config, the probe."""
    names = resolved.names if uses_resolver(policy) else None
    generation = names.generation if names is not None else f"off{secrets.token_hex(4)}"
    nameservers = [RESOLVER] if names is not None else resolved.dns_servers
    return {
        "CORRAL_DNS_GEN": generation,
        "CORRAL_DNS_SETS": names.ipset_payload(policy) if names is not None else "",
        "CORRAL_DNS_CONFIG": names.resolver_config(policy)
        if names is not None
        else refuse_all_config(generation),
        "CORRAL_DNS_START": "1" if start_resolver else "",
        "CORRAL_DNS_NAMESERVERS": " ".join(str(a) for a in nameservers),
        "CORRAL_V4": payload.ipv4,
        "CORRAL_V6": payload.ipv6,
        "CORRAL_NAT4": payload.nat4,
        "CORRAL_GATE": GATE_CHAIN,
        "CORRAL_LINK": LINK,
        "CORRAL_CHAIN": CHAIN,
        "CORRAL_PROBE_HOST": "" if probe is None else str(probe[0]),
        "CORRAL_PROBE_PORT": str(DISCARD_PORT if probe is None else probe[1]),
        "CORRAL_PROBE_TABLES": "ip6tables" if probe and probe[0].version == 6 else "iptables",
    }


def _judge_probe(policy: NetworkPolicy, probe: tuple[IPAddress, int], output: str) -> None:
    """The probe must have been refused, and by corral's rules (a REJECT counted)."""
    lines = dict(line.split("=", 1) for line in output.split() if "=" in line)
    target = f"{probe[0]}:{probe[1]}"
    if lines.get("probe") != "refused":
        raise NetworkPolicyNotEnforced(f"probe to {target}, which {policy} forbids, got through")
    if int(lines.get("rejects", "0") or 0) == 0:
        raise NetworkPolicyNotEnforced(
            f"probe to {target} failed, but not through corral's rules (no REJECT counted)"
        )


async def install_resolver(engine: Engine, holder: str) -> None:
    """corral's helper into the holder's own filesystem as DNS_DIR/resolver."""
    version: dict[str, Any] = await engine.call(engine.api.version)
    arch = str(version.get("Arch", ""))
    binary = helper_binary(arch)
    if binary is None:
        raise ProviderError(
            f"allowlisted hostnames need corral's helper: {no_helper(arch)}; "
            "the previous policy is still in force"
        )
    archive = await anyio.to_thread.run_sync(_resolver_archive, binary.read_bytes())
    try:
        await engine.call(engine.api.put_archive, holder, "/", archive)
    except APIError as exc:
        raise ProviderError(f"putting corral's resolver into the holder failed: {exc}") from None


def _resolver_archive(data: bytes) -> bytes:
    folder = DNS_DIR.lstrip("/")
    return owned_by_root({f"{folder}/resolver": (data, 0o700)}, dirs={folder: 0o700})


async def policy_in_force(engine: Engine, holder: str) -> tuple[PolicyRecord, Phase | None]:
    """The record `apply_policy` last left in the holder's namespace, read from the kernel
    with the holder's own tools; both families must carry the same one. With it, the
    phase its refusals are stamped with."""
    result = await run_own(engine, holder, ["sh", "-c", _SAVED])
    v4, _, v6 = result.stdout.partition("#corral-ipv6")
    try:
        if result.returncode != 0 or result.stdout_truncated:
            raise ValueError(f"iptables-save failed (exit {result.returncode})")
        record = read_record(v4)
        if read_record(v6) != record:
            raise ValueError("the IPv4 and IPv6 rules carry different policies")
        phase = phase_in_rules(v4)
    except ValueError as exc:
        raise ProviderError(
            f"cannot read the policy in force from holder {holder[:12]}: {exc}"
        ) from None
    return record, phase


async def _rejects(engine: Engine, holder: str, version: int) -> int:
    tables = "ip6tables" if version == 6 else "iptables"
    result = await run_own(engine, holder, ["sh", "-c", _REJECTS, "sh", tables, CHAIN])
    if result.returncode != 0:
        raise ProviderError(f"reading corral's REJECT counters failed: {result.stderr.strip()}")
    return int(result.stdout.strip() or 0)


async def probe_from_sandbox(
    engine: Engine,
    holder: str,
    sandbox: str,
    probe: tuple[IPAddress, int],
    runtime: str,
    *,
    events: EventLog | None = None,
) -> None:
    """Dial `probe`, which the policy in force forbids, from inside the sandbox container.

    The holder's probe shows the namespace's rules; this one shows that the sandbox's
    packets meet them, which a runtime with a network stack of its own (gVisor's netstack)
    bypasses. The verdict is the holder's REJECT counter, which nothing in the sandbox can
    raise without going through corral's rules; a probe that could not run fails closed.
    """
    host, port = probe
    before = await _rejects(engine, holder, host.version)
    if events is not None:
        events.expect_own(host, port)
    # corral's busybox from the read-only programs volume, not anything of the image's.
    dial = await run_own(engine, sandbox, [programs.BUSYBOX, "nc", "-w", "2", str(host), str(port)])
    after = await _rejects(engine, holder, host.version)
    if dial.returncode == 0:
        raise NetworkPolicyNotEnforced(
            f"a connection from the sandbox (runtime {runtime!r}) to {host}:{port}, which the "
            "policy forbids, got through"
        )
    if after <= before:
        raise NetworkPolicyNotEnforced(
            f"a connection from the sandbox (runtime {runtime!r}) to {host}:{port} did not "
            f"meet corral's rules (exit {dial.returncode}: {dial.stderr.strip()[-200:]!r}); "
            "a runtime with a network stack of its own (gVisor's netstack) bypasses them "
            "unless it runs behind a gateway (DockerConfig.gateway)"
        )
