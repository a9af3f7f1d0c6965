"""Applying a policy through the holder: resolve, render, one restore per family, probe.

Everything runs in one exec in the holder, which owns the sandbox's network namespace and
alone has NET_ADMIN. If the IPv6 restore fails after the IPv4 one succeeded, the saved
IPv4 table is restored, so the old policy stays whole.
"""

from __future__ import annotations

import contextlib
import io
import secrets
import tarfile
from collections.abc import Mapping, Sequence

from docker.errors import APIError

from corral.core.output import DEFAULT_OUTPUT_LIMIT
from corral.core.session import ExecResult
from corral.errors import NetworkPolicyNotEnforced, ProviderError
from corral.network.dns import Answer, resolve_names
from corral.network.events import EventLog, phase_in_rules
from corral.network.iptables import CHAIN, render_iptables
from corral.network.policy import NetworkPolicy, Phase
from corral.network.policy_record import PolicyRecord, read_record
from corral.network.probe import DISCARD_PORT, forbidden_probe
from corral.network.resolve import Resolution, parse_resolv_conf, resolve_policy
from corral.network.targets import EntryType, IPAddress
from corral.providers.docker.engine import Engine, call
from corral.providers.docker.execution import run_exec

_APPLY = r"""
old=$(iptables-save -t filter 2>/dev/null)
printf '%s' "$CORRAL_V4" | iptables-restore -w 5 || { echo 'iptables-restore failed' >&2; exit 3; }
if ! printf '%s' "$CORRAL_V6" | ip6tables-restore -w 5; then
  echo 'ip6tables-restore failed' >&2
  [ -n "$old" ] && printf '%s\n' "$old" | iptables-restore -w 5
  exit 4
fi
[ -z "$CORRAL_PROBE_HOST" ] && exit 0
if busybox nc -w 2 "$CORRAL_PROBE_HOST" "$CORRAL_PROBE_PORT" </dev/null >/dev/null 2>&1; then
  echo probe=connected
else
  echo probe=refused
fi
$CORRAL_PROBE_TABLES -w 5 -nvxL "$CORRAL_CHAIN" \
  | awk '$3 == "REJECT" {n += $1} END {print "rejects=" n+0}'
"""
_SAVED = "iptables-save -t filter && echo '#corral-ipv6' && ip6tables-save -t filter"
_REJECTS = r"""$1 -w 5 -nvxL "$2" | awk '$3 == "REJECT" {n += $1} END {print n+0}'"""
#: corral's own static busybox, from its holder image, for the probe from the sandbox.
_BUSYBOX = "/bin/busybox"


async def _as_root(
    api: Engine,
    tokens: int,
    container: str,
    argv: list[str],
    env: dict[str, str] | None = None,
    stdin: bytes | None = None,
) -> ExecResult:
    """A control command of corral's own, as root, with a bounded wait."""
    return await run_exec(
        api,
        tokens,
        container,
        argv,
        env=env or {},
        workdir=None,
        user="0",
        stdin=stdin,
        timeout=60,
        on_output=None,
        output_limit=DEFAULT_OUTPUT_LIMIT,
    )


async def dns_servers(api: Engine, tokens: int, holder: str) -> tuple[IPAddress, ...]:
    """The network's resolvers, read from the holder before any sandbox joins it."""
    result = await _as_root(api, tokens, holder, ["cat", "/etc/resolv.conf"])
    return parse_resolv_conf(result.stdout)


async def resolve_in(
    api: Engine,
    tokens: int,
    container: str,
    hosts: Sequence[str],
    *,
    servers: Sequence[IPAddress],
    static: Mapping[str, str],
) -> dict[str, Answer]:
    """Resolve `hosts` with corral's own queries, sent from `container` (holder image).

    Never through the namespace's /etc/hosts or libc: the sandbox shares those files and
    can rewrite them. The harness's `extra_hosts` come from the config instead.
    """
    if not hosts:
        return {}

    async def run(argv: list[str], stdin: bytes) -> str:
        result = await _as_root(api, tokens, container, argv, stdin=stdin)
        if result.stdout_truncated:
            raise ValueError("the DNS answers were longer than corral reads")
        return result.stdout

    try:
        return await resolve_names(hosts, servers=servers, run=run, static=static)
    except ValueError as exc:
        raise ProviderError(f"resolving {', '.join(hosts)} failed: {exc}") from None


async def resolve(
    api: Engine,
    tokens: int,
    container: str,
    policy: NetworkPolicy,
    *,
    dns: tuple[IPAddress, ...],
    extra_hosts: Mapping[str, str],
) -> Resolution:
    """The policy's hostnames as corral resolves them from `container` (holder image)."""
    hostnames = [t.host for t in policy.targets if t.entry_type is EntryType.HOSTNAME]
    answers = await resolve_in(api, tokens, container, hostnames, servers=dns, static=extra_hosts)

    async def lookup(host: str) -> tuple[IPAddress, ...]:
        answer = answers.get(host)
        return answer.addresses if answer else ()

    ttls = [a.ttl for a in answers.values() if a.addresses]
    return (await resolve_policy(policy, lookup, dns)).model_copy(
        update={"ttl_s": float(min(ttls)) if ttls else (0.0 if answers else None)}
    )


async def apply_policy(
    api: Engine,
    tokens: int,
    holder: str,
    policy: NetworkPolicy,
    resolved: Resolution,
    *,
    probe_candidates: list[tuple[IPAddress, int]],
    phase: Phase | None,
    events: EventLog | None = None,
) -> None:
    """Render and apply `policy` in one holder exec, then check it with a probe.

    Refusals are logged stamped with `phase`; the probe's own is taken out of `events`."""
    payload = render_iptables(policy, resolved, phase=phase)
    probe = forbidden_probe(policy, resolved, probe_candidates)
    if probe is not None and events is not None:
        events.expect_own(*probe)
    env = {
        "CORRAL_V4": payload.ipv4,
        "CORRAL_V6": payload.ipv6,
        "CORRAL_CHAIN": CHAIN,
        "CORRAL_PROBE_HOST": "" if probe is None else str(probe[0]),
        "CORRAL_PROBE_PORT": str(DISCARD_PORT if probe is None else probe[1]),
        "CORRAL_PROBE_TABLES": "ip6tables" if probe and probe[0].version == 6 else "iptables",
    }
    result = await _as_root(api, tokens, holder, ["sh", "-c", _APPLY], env)
    if result.returncode != 0:
        raise ProviderError(
            f"applying network policy {policy} failed (exit {result.returncode}): "
            f"{result.stderr.strip()[-500:]}; the previous policy is still in force"
        )
    if probe is not None:
        lines = dict(line.split("=", 1) for line in result.stdout.split() if "=" in line)
        target = f"{probe[0]}:{probe[1]}"
        if lines.get("probe") != "refused":
            raise NetworkPolicyNotEnforced(
                f"probe to {target}, which {policy} forbids, got through"
            )
        if int(lines.get("rejects", "0") or 0) == 0:
            raise NetworkPolicyNotEnforced(
                f"probe to {target} failed, but not through corral's rules (no REJECT counted)"
            )


async def policy_in_force(
    api: Engine, tokens: int, holder: str
) -> tuple[PolicyRecord, Phase | None]:
    """The record `apply_policy` last left in the holder's namespace, read from the kernel
    with the holder's own tools; both families must carry the same one. With it, the
    phase its refusals are stamped with."""
    result = await _as_root(api, tokens, holder, ["sh", "-c", _SAVED])
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


async def _rejects(api: Engine, tokens: int, holder: str, version: int) -> int:
    tables = "ip6tables" if version == 6 else "iptables"
    result = await _as_root(api, tokens, holder, ["sh", "-c", _REJECTS, "sh", tables, CHAIN])
    if result.returncode != 0:
        raise ProviderError(f"reading corral's REJECT counters failed: {result.stderr.strip()}")
    return int(result.stdout.strip() or 0)


def _copy_busybox(api: Engine, holder: str, sandbox: str, name: str) -> None:
    """The holder's busybox into the sandbox's root as `name` (blocking)."""
    try:
        stream, _ = api.get_archive(holder, _BUSYBOX)
        raw = b"".join(stream)
    except APIError as exc:
        raise ProviderError(f"reading {_BUSYBOX} from corral's image failed: {exc}") from None
    with tarfile.open(fileobj=io.BytesIO(raw)) as source:
        member = source.next()
        body = source.extractfile(member) if member is not None else None
        if body is None:
            raise ProviderError(f"corral's image has no {_BUSYBOX}")
        data = body.read()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        folder = tarfile.TarInfo(name)
        folder.type, folder.mode = tarfile.DIRTYPE, 0o700
        archive.addfile(folder)
        # Named busybox: it picks its applet from argv[0] unless called by that name.
        info = tarfile.TarInfo(f"{name}/busybox")
        info.size, info.mode = len(data), 0o700
        archive.addfile(info, io.BytesIO(data))
    try:
        api.put_archive(sandbox, "/", out.getvalue())
    except APIError as exc:
        raise ProviderError(f"putting corral's probe into the sandbox failed: {exc}") from None


async def probe_from_sandbox(
    api: Engine,
    tokens: int,
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
    folder = f"/.corral-probe-{secrets.token_hex(4)}"
    busybox = f"{folder}/busybox"
    before = await _rejects(api, tokens, holder, host.version)
    if events is not None:
        events.expect_own(host, port)
    try:
        await call(tokens, _copy_busybox, api, holder, sandbox, folder.lstrip("/"))
        dial = await _as_root(
            api, tokens, sandbox, [busybox, "nc", "-w", "2", str(host), str(port)]
        )
    finally:
        with contextlib.suppress(ProviderError):
            await _as_root(api, tokens, sandbox, [busybox, "rm", "-rf", folder])
    after = await _rejects(api, tokens, holder, host.version)
    if dial.returncode == 0:
        raise NetworkPolicyNotEnforced(
            f"a connection from the sandbox (runtime {runtime!r}) to {host}:{port}, which the "
            "policy forbids, got through"
        )
    if after <= before:
        raise NetworkPolicyNotEnforced(
            f"a connection from the sandbox (runtime {runtime!r}) to {host}:{port} did not "
            f"meet corral's rules (exit {dial.returncode}: {dial.stderr.strip()[-200:]!r}); "
            "a runtime with a network stack of its own (gVisor's netstack) bypasses them: "
            "use runc"
        )
