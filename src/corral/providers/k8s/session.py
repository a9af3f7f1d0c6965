"""A `k8s` sandbox: one Pod, selected by its NetworkPolicy through a session label.

The plan's services are further containers of that Pod (`pod.SERVICES`): `exec` and the
file calls given `service=` run in that container, relative paths from its working
directory; the policy covers them all, as it selects the Pod.
"""

from __future__ import annotations

import functools
import itertools
import os
import posixpath
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import anyio
from anyio.lowlevel import EventLoopToken

from corral.core.output import BoundedOutput
from corral.core.processes import ProcessManager, StartRequest
from corral.core.session import EnvironmentSession, ExecRequest, ExecResult
from corral.core.snapshot import SnapshotRef
from corral.core.snapshot_store import SnapshotRecord, SnapshotShelf
from corral.core.tarsafe import (
    CHUNK,
    extract_tar,
    file_limit,
    pack_dir,
    pack_file,
    replacing,
    validate_dir,
)
from corral.core.treelimits import TreeLimits, bounded
from corral.errors import (
    ConfigError,
    ExecUserUnsupported,
    FeatureUnsupported,
    NetworkPolicyNotEnforced,
    NetworkPolicyUnsupported,
    ProviderError,
    RemotePathNotFound,
    UnsafeArchiveMember,
)
from corral.helper.channel import Executor, PlainExecutor
from corral.helper.link import ChannelUnavailable
from corral.helper.procs import ProcessClient, ProcessLink
from corral.network.policy import NetworkPolicy
from corral.network.probe import narrowed
from corral.network.resolve import Resolution, hostnames, needs_dns
from corral.network.targets import EntryType, IPAddress
from corral.providers.k8s import enforcement
from corral.providers.k8s.api import stoppable
from corral.providers.k8s.channel import (
    PROBE_HELPER,
    ChannelExecutor,
    start_program,
)
from corral.providers.k8s.execution import (
    ExecStream,
    Target,
    exit_code,
    run_blocking_exec,
    run_exec,
    run_own,
)
from corral.providers.k8s.forward import PortForwarder
from corral.providers.k8s.pod import BUSYBOX, corral_sh
from corral.providers.k8s.reaper import Reaper

MISSING = 44
IS_DIR = 45
IS_LINK = 46
NO_TAR = 127
# Run by corral's busybox in the sandbox container, by the image's tools in a service
# (`Place.script`). `$3` = dir refuses a root that is a symlink. Stdin holds first `$4`
# bytes of the archive's directories (relative, NUL-separated, parents first): a symlink
# at one's place is removed before the archive goes in, so no member is written through
# it (busybox's tar would follow it; `dd bs=1` reads no byte past the list). `$5` is the
# shell that removes them. `tar -x` replaces a symlink at a file member's place.
_UNTAR = (
    'mkdir -p "$1" && if [ "$3" = dir ] && [ -L "$1" ]; then exit 46; fi && cd "$1" '
    '&& dd bs=1 count="$4" 2>/dev/null | xargs -0 -r $5 -c '
    """'for d; do if [ -L "$d" ]; then rm -f "$d"; fi; done' sh """
    '&& head -c "$2" | tar -x -f - -C "$1"'
)
_TAR = '[ -d "$1" ] || exit 44; cd "$1" && exec tar -c -f - .'
# A read in the sandbox container is corral's helper's (`--file-size`, `--file-range`):
# it opens the path without following a link there nor blocking on a FIFO, and reads only
# a regular file. Where the helper is not there (a service, exec_channel=False) these
# scripts make the same checks with the container's tools; what the workload swaps in
# between check and read is bounded by `dd`'s count and by the deadlines below.
_REGULAR = (
    '[ -L "$1" ] && exit 46; [ -e "$1" ] || exit 44; [ -d "$1" ] && exit 45; [ -f "$1" ] || exit 47'
)
_SIZE = f'{_REGULAR}; wc -c < "$1"'
# One range of a file; `dd` counts in MiB blocks.
_RANGE = f'{_REGULAR}; exec dd if="$1" bs=1048576 skip="$2" count="$3" 2>/dev/null'
NOT_REGULAR = 47
RANGE_MIB = 8
RANGE_TRIES = 3
#: seconds corral waits for a file's size (a stat), whatever the plan's timeout
SIZE_DEADLINE_S = 30.0
#: seconds for one range (RANGE_MIB) of a read
RANGE_DEADLINE_S = 120.0


@dataclass(frozen=True)
class Place:
    """Where a call of the session lands: a container, and its working directory.

    `corral_s`: the sandbox container, where corral's own commands (the file calls) run
    with corral's busybox from the read-only programs volume; a service's run with its
    image's `sh` and tools (SECURITY.md, known gaps).
    """

    target: Target
    workdir: str
    corral_s: bool = False

    def script(self, script: str, *args: str) -> list[str]:
        """`script` with `args`, by corral's shell where this place has it."""
        return corral_sh(script, *args) if self.corral_s else ["sh", "-c", script, "sh", *args]


class KubernetesSession(EnvironmentSession):
    _tools = (BUSYBOX,)

    def __init__(
        self,
        *,
        id: str,
        policy: NetworkPolicy,
        target: Target,
        prober: Target,
        service_places: dict[str, Place],
        policy_name: str,
        labels: dict[str, str],
        dns: tuple[IPAddress, ...],
        host_aliases: dict[str, str],
        probe_candidates: list[tuple[IPAddress, int]],
        verify: bool,
        verify_timeout_s: float,
        workdir: str,
        output_limit: int,
        default_timeout: float | None,
        reaper: Reaper,
        snapshots: SnapshotShelf,
        snapshot_paths: tuple[str, ...] | None,
        snapshot_limits: TreeLimits,
        exec_channel: bool = True,
        helper_copied: bool = False,
        image: str = "",
        run_as: int | None = None,
    ) -> None:
        super().__init__(id=id, policy=policy, image=image, services=tuple(service_places))
        self.target = target
        #: the uid the Pod's containers run as, from its spec (None: the image's user)
        self.run_as = run_as
        #: how the sandbox container's execs run: one helper reached over one websocket
        #: (`channel.py`), or one websocket exec each; services always the latter
        self.executor: Executor = (
            ChannelExecutor(target, id, copied=helper_copied)
            if exec_channel
            else PlainExecutor(functools.partial(run_exec, target))
        )
        self.prober = prober
        self.policy_name = policy_name
        self.labels = labels
        self.dns = dns
        self.host_aliases = host_aliases
        self.probe_candidates = probe_candidates
        self.verify = verify
        self.verify_timeout_s = verify_timeout_s
        self.workdir = workdir
        self.output_limit = output_limit
        self.default_timeout = default_timeout
        self.last_enforced_s = 0.0
        #: what the policy in force resolved to; None until known (a reattached policy
        #: with hostnames, until re-applied)
        self.resolution: Resolution | None = None if hostnames(policy) else Resolution()
        self.forwards: dict[int, PortForwarder] = {}
        self.reaper = reaper
        self.snapshots = snapshots
        self.snapshot_paths = snapshot_paths
        self.snapshot_limits = snapshot_limits
        self.service_places = service_places
        self.procs = ProcessClient(self._connect_procs, self._place_process, sandbox_id=id)

    def _place(self, service: str | None) -> Place:
        """The sandbox container, or the container of the plan's service `service` (a
        name not among the session's services is a ConfigError naming it)."""
        name = self.service_name(service)
        if name is None:
            return Place(self.target, self.workdir, corral_s=True)
        return self.service_places[name]

    async def endpoint(self, port: int) -> str | None:
        """A URL on 127.0.0.1 forwarded to `port` in the Pod, open until close()."""
        if port not in self.forwards:
            if self.owned is None:
                return None
            forwarder = await anyio.to_thread.run_sync(
                PortForwarder, self.target.clients, self.target.namespace, self.target.pod, port
            )
            # In a worker thread: joining the forwarder's threads must not hold the loop.
            self.owned.push_async_callback(anyio.to_thread.run_sync, forwarder.close)
            self.forwards[port] = forwarder
        return f"http://127.0.0.1:{self.forwards[port].port}"

    def _absolute(self, path: str, workdir: str | None = None) -> str:
        return posixpath.normpath(posixpath.join(workdir or self.workdir, path))

    async def _process_manager(self, service: str | None) -> ProcessManager:
        if service is not None:
            raise FeatureUnsupported(
                f"background processes in a service (service={service!r}): a service runs "
                "none of corral's programs; use exec(..., service=...)"
            )
        if not isinstance(self.executor, ChannelExecutor):
            raise FeatureUnsupported(
                "background processes need corral's helper in the Pod (exec_channel=False)"
            )
        return self.procs

    async def _connect_procs(self, token: EventLoopToken) -> ProcessLink:
        """A stream to the Pod's process manager (started by the first one, from the
        programs volume, as the container's user: the exec API cannot switch users)."""
        assert isinstance(self.executor, ChannelExecutor)
        try:
            path = await self.executor.installed()
            return await start_program(
                self.target,
                [path, "--procs", self.id],
                lambda transport: ProcessLink(transport, token, "k8s", self.target.tokens, self.id),
            )
        except ChannelUnavailable as exc:
            raise FeatureUnsupported(
                f"Pod {self.target.pod}: background processes need corral's process manager: {exc}"
            ) from None

    def _place_process(self, request: StartRequest) -> dict[str, Any]:
        own_user(request.user, self.run_as)
        cwd = self._absolute(request.cwd) if request.cwd is not None else self.workdir
        env = [f"{k}={v}" for k, v in request.env.items()]
        return {"argv": list(request.args), "cwd": cwd, "env": env, "user": "", "as_self": True}

    async def _exec(self, request: ExecRequest) -> ExecResult:
        own_user(request.user, self.run_as)
        place = self._place(request.service)
        cwd = self._absolute(request.cwd, place.workdir) if request.cwd is not None else None
        # The user taken is the Pod's own: the command runs as the container does, with no
        # name looked up in the sandbox's passwd.
        request = replace(request, cwd=cwd, user=None)
        try:
            if request.service is None:
                return await self.executor.run(request)
            return await run_exec(place.target, request)
        except ProviderError as exc:
            if request.service is None or type(exc) is not ProviderError:
                raise
            hint = (
                "; exec runs `sh` and `env` in the container (the service's image needs them)"
                if "executable file not found" in str(exc)
                else ""
            )
            raise ProviderError(f"service {request.service!r}: {exc}{hint}") from None

    async def _plain(self, place: Place, argv: list[str]) -> ExecResult:
        """A command of corral's own (the file calls' checks): one websocket exec, never
        through the exec channel, whose helper the workload controls; bounded in time by
        corral even where the plan sets no timeout."""
        deadline = min(SIZE_DEADLINE_S, self.default_timeout or SIZE_DEADLINE_S)
        return await run_own(place.target, argv, timeout=deadline, output_limit=self.output_limit)

    async def _reader(self, place: Place) -> str | None:
        """corral's helper as `place` runs it, for file reads; None where it has none."""
        if not place.corral_s or not isinstance(self.executor, ChannelExecutor):
            return None
        try:
            return await self.executor.installed()
        except (ChannelUnavailable, ProviderError):
            return None

    async def _stream_in(
        self,
        place: Place,
        directory: str,
        chunks: Iterator[bytes],
        *,
        root: bool,
        dirs: tuple[str, ...] = (),
    ) -> None:
        """Spool the tar (to learn its length), then send it over stdin, length-bounded.

        `root`: `directory` is the upload's root, which must not be a symlink. `dirs`: the
        archive's directories, relative to it, parents first (see `_UNTAR`).
        """
        listed = b"".join(d.encode() + b"\0" for d in dirs)
        with tempfile.TemporaryFile() as spool:
            size = await stoppable(
                self.target.tokens, functools.partial(_spool, spool, listed, chunks)
            )
            frames = iter(lambda: spool.read(CHUNK), b"")
            stderr = BoundedOutput(64 * 1024)
            # Cancelled midway, the stream is dropped within a poll: the Pod's tar sees
            # its archive end early and fails, and nothing past it is sent.
            status, _ = await stoppable(
                self.target.tokens,
                functools.partial(
                    run_blocking_exec,
                    place.target,
                    place.script(
                        _UNTAR,
                        directory,
                        str(size),
                        "dir" if root else "",
                        str(len(listed)),
                        f"{BUSYBOX} sh" if place.corral_s else "sh",
                    ),
                    frames,
                    None,
                    lambda name, data: stderr.feed(data) if name == "stderr" else None,
                ),
            )
        code = exit_code(status)
        if code == NO_TAR or "tar: not found" in stderr.text():
            raise ProviderError(
                f"the image of container {place.target.container!r} has no `tar`; file transfer "
                "needs it"
            )
        if code == IS_LINK:
            raise UnsafeArchiveMember(
                f"sandbox path {directory!r} is a symlink; refusing to upload through it"
            )
        if code != 0:
            raise ProviderError(f"unpacking into {directory!r} failed: {stderr.text().strip()}")

    async def _upload(self, local: Path, remote: str, service: str | None) -> None:
        place = self._place(service)
        path = self._absolute(remote, place.workdir)
        parent, name = posixpath.split(path)
        await self._stream_in(place, parent, pack_file(local, name), root=False)

    async def _upload_dir(self, local_dir: Path, remote_dir: str, service: str | None) -> None:
        """Unpacked by corral's busybox `tar` (a service's own `tar` in a service). Against
        links the workload planted, the root may not be one and members replace links at
        their places; the parents of the root are followed as the Pod resolves them (the
        image's own `/bin -> usr/bin` among them).
        """
        place = self._place(service)
        dirs = await anyio.to_thread.run_sync(_directories, local_dir)
        root = self._absolute(remote_dir, place.workdir)
        await self._stream_in(place, root, pack_dir(local_dir), root=True, dirs=dirs)

    async def _download(
        self, remote: str, local: Path, service: str | None, max_bytes: int | None
    ) -> None:
        """Read the file in ranges, each checked against the size the Pod reported.

        Released kubernetes clients can drop the tail of a large exec stream; a short
        range is read again rather than written short. The Pod's size only says how many
        bytes corral reads, never more than `max_bytes`: a Pod that claims less than it
        holds gets its file cut short, never a transfer past the limit.
        """
        place = self._place(service)
        source = self._absolute(remote, place.workdir)
        helper = await self._reader(place)
        sized = await self._plain(
            place, [helper, "--file-size", source] if helper else place.script(_SIZE, source)
        )
        _refused(remote, sized)
        printed = sized.stdout.strip()
        if not (printed.isascii() and printed.isdigit()) or len(printed) > 19:
            raise ProviderError(f"reading {remote!r}: its size came back as {printed[:40]!r}")
        size = int(printed)
        file_limit(remote, size, max_bytes)

        def read_range(index: int, stop: threading.Event) -> bytes:
            want = min(RANGE_MIB << 20, size - (index * RANGE_MIB << 20))
            where = (source, str(index * RANGE_MIB), str(RANGE_MIB))
            argv = [helper, "--file-range", *where] if helper else place.script(_RANGE, *where)
            for _ in range(RANGE_TRIES):
                deadline = time.monotonic() + RANGE_DEADLINE_S
                execution = ExecStream(place.target, argv, deadline=deadline, stop=stop)
                data = _at_most(remote, execution, want)
                if stop.is_set():  # cancelled: `local` is left as it was
                    raise ProviderError(f"reading {remote!r} was cancelled")
                if execution.timed_out:
                    raise ProviderError(
                        f"reading {remote!r}: {RANGE_MIB} MiB of it took over "
                        f"{RANGE_DEADLINE_S:.0f} s (RANGE_DEADLINE_S)"
                    )
                if len(data) == want:
                    return data
            raise ProviderError(f"reading {remote!r}: the Pod kept sending short ranges")

        def copy(stop: threading.Event) -> None:
            with replacing(local) as out:
                for index in range(-(-size // (RANGE_MIB << 20))):
                    out.write(read_range(index, stop))

        await stoppable(self.target.tokens, copy)

    async def _download_dir(self, remote_dir: str, local_dir: Path, service: str | None) -> None:
        place = self._place(service)
        source = self._absolute(remote_dir, place.workdir)
        statuses: list[str] = []

        def extract(stop: threading.Event) -> None:
            # Cancelled midway, the archive ends early (a ProviderError the cancellation
            # replaces); what was already unpacked under `local_dir` stays.
            execution = ExecStream(place.target, place.script(_TAR, source), stop=stop)
            frames = iter(execution)
            chunks = (data for name, data in frames if name == "stdout")
            # The script's own test of the path, read before anything is made locally: one
            # exec where a separate check took two.
            first = next(chunks, None)
            if first is None and exit_code(execution.status) == MISSING:
                raise RemotePathNotFound(remote_dir)
            try:
                extract_tar(itertools.chain([first or b""], chunks), local_dir)
            except tarfile.TarError as exc:
                # What the Pod's tar printed (its to replace) is not an archive, or ended early.
                raise ProviderError(
                    f"the archive of {remote_dir!r} from the Pod is malformed or cut short: {exc}"
                ) from None
            for _ in frames:  # tar stops at its end marker; read on to the exit status
                pass
            statuses.append(execution.status)

        await stoppable(self.target.tokens, extract)
        if exit_code(statuses[0]) != 0:
            raise ProviderError(f"packing {remote_dir!r} in the Pod failed")

    async def _apply_network_policy(self, policy: NetworkPolicy) -> None:
        hostnames = any(
            t.entry_type is EntryType.HOSTNAME and t.host not in self.host_aliases
            for t in policy.targets
        )
        if hostnames and not needs_dns(self.policy):
            raise NetworkPolicyUnsupported(
                f"cannot resolve the hostnames of {policy} while {self.policy} closes DNS in "
                "the Pod; list their addresses, or switch through a policy that allows DNS"
            )
        try:
            await self.enforce(policy)
        except NetworkPolicyNotEnforced as exc:
            await self.fail_enforcement(str(exc))

    async def enforce(self, policy: NetworkPolicy) -> None:
        """Patch the NetworkPolicy to `policy` and, unless turned off, probe it: what the
        policy in force let through and `policy` takes away is dialled before the patch,
        and what connected then must be refused after it."""
        resolved = await enforcement.resolve(self.prober, policy, self.dns, self.host_aliases)
        body = enforcement.render(policy, resolved, self.policy_name, self.id, self.labels)
        dialler = await self._dialler() if self.verify else None
        answered: list[tuple[IPAddress, int]] = []
        if self.verify and self.resolution is not None:
            taken = narrowed(self.policy, self.resolution, policy, resolved)
            answered = await enforcement.answering(self.prober, taken, dialler)
        await enforcement.replace_spec(
            self.target.clients, self.target.namespace, self.policy_name, body
        )
        if self.verify:
            self.last_enforced_s = await enforcement.verify(
                self.prober,
                policy,
                resolved,
                self.probe_candidates,
                self.verify_timeout_s,
                dialler=dialler,
                answered=answered,
            )
        self.policy = policy
        self.resolution = resolved

    async def _dialler(self) -> str | None:
        """corral's helper as the probe container sees it, put in the programs volume
        (through that container) on first use: its dial reports an ICMP refusal at once,
        where busybox's waits a second for a retransmit. None: busybox's dial."""
        if not isinstance(self.executor, ChannelExecutor):
            return None
        try:
            await self.executor.installed()
        except (ChannelUnavailable, ProviderError):
            return None
        return PROBE_HELPER

    async def _end_workload(self) -> None:
        """Every process of the sandbox container but its PID 1, killed and shown gone by
        the reaper (in that container's PID namespace). The services keep running: they
        are the task's infrastructure (a database the grader reads), each in a PID
        namespace of its own, which the reaper neither sees nor touches."""
        self.executor.reset()  # the exec channel's helper dies with the workload
        self.procs.reset()  # so do the process manager and every process it held
        await self.reaper.end_workload()

    async def _save(self) -> SnapshotRef:
        """Each snapshot path, through `download_dir` (hardened against the Pod's archive)
        and held to `snapshot_limits`, into a new snapshot directory on this host.

        The sandbox container's paths only: a fork starts the plan's services afresh from
        their images, without the state the parent's services had."""

        async def fill(record: SnapshotRecord) -> None:
            with bounded(self.snapshot_limits):
                for index, path in enumerate(record.paths):
                    await self.download_dir(path, self.snapshots.tree(record.id, index))

        paths = saved_paths(self.snapshot_paths, self.workdir)
        return await self.snapshots.write(self.id, paths, fill)


def own_user(asked: str | None, uid: int | None) -> None:
    """Refuse a user other than the one the Pod runs as, which the Kubernetes exec API
    runs every command as: the uid itself, or "root" for 0. The image's user (no uid in
    the spec) is known only to the image, so no name is taken for it."""
    if asked is None:
        return
    if uid is not None and asked in {str(uid), *(("root",) if uid == 0 else ())}:
        return
    runs_as = "its image's user (run_as_user unset)" if uid is None else f"uid {uid}"
    raise ExecUserUnsupported(
        f"the Kubernetes exec API cannot switch user (asked for {asked!r}) and this Pod "
        f"runs as {runs_as}; set run_as_user in the provider config to the uid asked "
        "for (0 for 'root'), or ask for no user"
    )


def _directories(local_dir: str | Path) -> tuple[str, ...]:
    """The tree's directories below its root, relative, parents first (blocking; checks
    the tree as `validate_dir` does)."""
    validate_dir(local_dir)
    base = Path(local_dir)
    found: list[str] = []
    for parent, names, _ in os.walk(base):
        names.sort()
        found.extend(str((Path(parent) / name).relative_to(base)) for name in names)
    return tuple(found)


def saved_paths(configured: tuple[str, ...] | None, workdir: str) -> tuple[str, ...]:
    """The configured snapshot paths, else the session's working directory."""
    if configured is not None:
        return configured
    if workdir == "/":
        raise ConfigError(
            "the sandbox's working directory is '/', which a snapshot cannot hold; "
            "set snapshot_paths in the k8s config (or plan.workdir)"
        )
    return (workdir,)


def _spool(spool: IO[bytes], listed: bytes, chunks: Iterable[bytes], stop: threading.Event) -> int:
    """`listed`, then the archive's `chunks`, into `spool`, rewound; the archive's size."""
    spool.write(listed)
    for chunk in chunks:
        if stop.is_set():  # cancelled: the cancellation replaces this
            raise ProviderError("the upload was cancelled")
        spool.write(chunk)
    size = spool.tell() - len(listed)
    spool.seek(0)
    return size


def _refused(remote: str, sized: ExecResult) -> None:
    """A file read's size check that did not find a regular file, as an error naming it."""
    code = sized.returncode
    if code == 0 and not sized.timed_out:
        return
    if code == MISSING:
        raise RemotePathNotFound(remote)
    if code == IS_DIR:
        raise IsADirectoryError(f"sandbox path {remote!r} is a directory")
    if code == IS_LINK:
        raise UnsafeArchiveMember(
            f"sandbox path {remote!r} is a symlink; corral reads no file through one"
        )
    if code == NOT_REGULAR:
        kind = sized.stderr.strip()[:40] or "something else"
        raise UnsafeArchiveMember(f"sandbox path {remote!r} is not a regular file ({kind})")
    if sized.timed_out:
        raise ProviderError(
            f"reading {remote!r}: no size came back in time ({SIZE_DEADLINE_S:.0f} s, "
            "SIZE_DEADLINE_S, or the plan's timeout)"
        )
    raise ProviderError(f"reading {remote!r} failed: {sized.stderr.strip()}")


def _at_most(remote: str, execution: ExecStream, want: int) -> bytes:
    """The stdout of a range's exec, refused once past the `want` bytes corral asked for
    (the sandbox's root can write into the reader's stdout)."""
    data = bytearray()
    for name, chunk in execution:
        if name == "stdout":
            data += chunk
            if len(data) > want:
                raise ProviderError(f"reading {remote!r}: the Pod sent more than was asked")
    return bytes(data)
