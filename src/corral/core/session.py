"""One live sandbox: the transport interface every provider implements.

Contract (every provider, checked by `corral.testing`):

- `exec`: a list runs without a shell, a string through `sh -c`. A non-zero exit is a
  result, not an exception. A timeout kills the command's whole process tree inside the
  sandbox and returns `timed_out=True`, `returncode=124`. Transport failure raises
  `ProviderError`. Output is bounded (head and tail kept) and decoded with replacement.
  `exec` is final: it checks and normalizes its arguments once into an `ExecRequest`,
  logs once, and hands the request to the provider's `_exec(request)`.
- `upload_dir`/`download_dir`: the tree lands exactly at the requested root; members that
  would land outside it (links, absolute or `..` paths) are refused.
- `read_text` on a missing path raises `RemotePathNotFound` naming it.
- `set_network_policy` applies atomically; when applying or verifying fails, the sandbox is
  left with no network (or closed, if even that fails) and the error says which.
- `network_events()`: the refused attempts so far, bounded, where the provider declares
  `supports_network_events`; `FeatureUnsupported` elsewhere.
- `start`/`shell`/`processes()`/`process(id)`: processes the session owns
  (`corral.core.processes`, `corral.core.shell`), where the provider declares
  `supports_processes`; `end_workload()` and `close()` end them all.
"""

from __future__ import annotations

import abc
import inspect
import logging
import math
import tempfile
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio
from pydantic import BaseModel, ConfigDict

from corral.core.logs import event
from corral.core.output import DEFAULT_OUTPUT_LIMIT
from corral.core.processes import (
    DEFAULT_BUFFER_BYTES,
    Process,
    ProcessInfo,
    ProcessManager,
    PtySize,
    StartRequest,
)
from corral.core.snapshot import SnapshotRef
from corral.errors import (
    ConfigError,
    FeatureUnsupported,
    NetworkPolicyNotEnforced,
    NetworkPolicyUnsupported,
    ProcessNotFound,
    ProviderError,
    WorkloadNotStopped,
)
from corral.network.events import NetworkEvents
from corral.network.policy import NetworkPolicy, Phase

if TYPE_CHECKING:
    from corral.core.environment import BaseEnvironment
    from corral.core.shell import Shell

log = logging.getLogger("corral.session")

Stream = Literal["stdout", "stderr"]
OutputCallback = Callable[[Stream, str], object | Awaitable[object]]
Command = str | Sequence[str]
TIMEOUT_RETURNCODE = 124
FALLBACK_TIMEOUT_S = 60.0
#: bytes a `download` may bring back unless its call says otherwise (a sandbox can make a
#: file of any size, a sparse one for free)
DOWNLOAD_LIMIT_BYTES = 1 << 30
#: bytes `read_text` may hold in the harness's memory unless its call says otherwise
READ_TEXT_LIMIT_BYTES = 64 << 20


class ExecResult(BaseModel):
    """What a command did: its exit status and its output, decoded as UTF-8 with invalid
    bytes replaced, each stream kept to the session's `output_limit` (the rest dropped,
    `*_truncated` set)."""

    model_config = ConfigDict(frozen=True)

    #: the exit status; 124 when it timed out, None where the provider cannot know it
    returncode: int | None
    stdout: str
    stderr: str
    #: the command ran past its timeout and its process tree was killed
    timed_out: bool = False
    #: wall-clock seconds from the start of the call to its result
    duration_s: float
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def ok(self) -> bool:
        """Exit status 0, and not timed out."""
        return self.returncode == 0 and not self.timed_out


def argv(command: Command) -> list[str]:
    """A list runs as is; a string runs through `sh -c`."""
    if isinstance(command, str):
        if not command.strip():
            raise ValueError(f"command {command!r} is empty: give the shell something to run")
        args = ["sh", "-c", command]
    else:
        args = list(command)
        if not args or not all(isinstance(a, str) for a in args):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError(f"command {command!r} must be a string or a non-empty list of strings")
        if not args[0]:
            raise ValueError(f"command {command!r} names no program (its first item is empty)")
    if any("\0" in arg for arg in args):
        raise ValueError(f"command {command!r} must not contain a NUL byte")
    return args


@dataclass(frozen=True)
class ExecRequest:
    """One command as a provider's `_exec` receives it: built by `EnvironmentSession.exec`,
    every argument checked and normalized, the defaults the session owns resolved. What is
    left to the provider is what only it knows: where a relative `cwd` lands, which user
    None means, and how the command reaches the sandbox."""

    args: tuple[str, ...]
    #: as the caller gave it (relative to the session's working directory, or absolute);
    #: None: the session's working directory
    cwd: str | None = None
    #: added to the session's environment for this command only
    env: Mapping[str, str] = field(default_factory=dict[str, str])
    #: None: the session's user
    user: str | None = None
    #: seconds, the session's default already applied; None: no limit
    timeout: float | None = None
    #: None: the command reads end of input at once
    stdin: bytes | None = None
    on_output: OutputCallback | None = None
    #: bytes of each stream kept (head and tail)
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    #: the plan's service the command runs in; None: the sandbox itself
    service: str | None = None


def _cwd(cwd: object) -> str | None:
    if cwd is None or cwd == "":
        return None  # as no cwd: the session's working directory
    if not isinstance(cwd, str) or "\0" in cwd:
        raise ConfigError(f"exec cwd {cwd!r} must be a path without NUL bytes")
    return cwd


def _env(env: object) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise ConfigError(
            f"exec env must be a mapping of names to strings, not {type(env).__name__}"
        )
    checked: dict[str, str] = {}
    for name, value in env.items():  # pyright: ignore[reportUnknownVariableType]
        if not isinstance(name, str) or not name or "=" in name or "\0" in name:
            raise ConfigError(f"environment variable name {name!r} is not valid")
        if not isinstance(value, str) or "\0" in value:
            # The value itself is never shown: it may be a secret.
            raise ConfigError(
                f"environment variable {name!r} must have a string value without NUL bytes "
                f"(got a {type(value).__name__})"  # pyright: ignore[reportUnknownArgumentType]
            )
        checked[name] = value
    return checked


def _user(user: object) -> str | None:
    if user is not None and (not isinstance(user, str) or "\0" in user):
        raise ConfigError(f"exec user {user!r} must be a user name or id as a string")
    return user


def _timeout(timeout: object) -> float:
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not math.isfinite(timeout)
        or timeout <= 0
    ):
        raise ConfigError(
            f"exec timeout {timeout!r} must be a positive number of seconds "
            "(or None for the session's default)"
        )
    return float(timeout)


def _stdin(stdin: object) -> bytes | None:
    if stdin is None:
        return None
    if isinstance(stdin, str):
        return stdin.encode()
    if isinstance(stdin, bytes | bytearray):
        return bytes(stdin)
    raise ConfigError(f"exec stdin must be str or bytes, not {type(stdin).__name__}")


def _flag(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} {value!r} must be True or False")
    return value


def _pty(pty: object) -> PtySize | None:
    if pty is None or isinstance(pty, PtySize):
        return pty
    raise ConfigError(f"pty {pty!r} must be a PtySize(rows=..., cols=...) or None")


def _name(name: object) -> str | None:
    if name is not None and (not isinstance(name, str) or len(name) > 200 or "\0" in name):
        raise ConfigError(f"process name {name!r} must be a string of at most 200 characters")
    return name


def _callback(on_output: Any) -> OutputCallback | None:
    if on_output is not None and not callable(on_output):
        raise ConfigError(f"exec on_output {on_output!r} must be callable (stream, text)")
    return on_output


async def emit(callback: OutputCallback | None, stream: Stream, text: str) -> None:
    if callback is None or not text:
        return
    result = callback(stream, text)
    if inspect.isawaitable(result):
        await result


class EnvironmentSession(abc.ABC):
    """A live sandbox owned by one `BaseEnvironment.open()` call until `close()`."""

    output_limit: int = DEFAULT_OUTPUT_LIMIT
    #: seconds an exec may run when its call gives no timeout; None: no limit
    default_timeout: float | None = None
    #: bytes of each started process's output kept on the sandbox's side
    process_buffer_bytes: int = DEFAULT_BUFFER_BYTES

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in _FINAL:
            if name in cls.__dict__:
                raise TypeError(
                    f"{cls.__name__} overrides {name}(), which is final on "
                    f"EnvironmentSession; implement _{name}(...) instead"
                )

    def __init__(
        self,
        *,
        id: str,
        policy: NetworkPolicy,
        image: str = "",
        services: tuple[str, ...] = (),
        credential_env: Mapping[str, str] | None = None,
    ) -> None:
        self.id = id
        self.policy = policy
        #: the variables of the plan's credential routes (`route_env_name`) as corral gave
        #: them to the sandbox, read from corral's side (never from inside the sandbox)
        self.credential_env: Mapping[str, str] = dict(credential_env or {})
        #: the phase the policy in force was applied for (`TaskRun` names it), or None
        self.phase: Phase | None = None
        self.environment: BaseEnvironment | None = None
        self.owned: AsyncExitStack | None = None
        self.closed = False
        self.image = image
        #: names of the plan's services running beside the sandbox (`service=` reaches one)
        self.services = services
        #: bounds, in seconds, on how long a resolved hostname is trusted before it is
        #: resolved again (its TTL, clamped into this range)
        self.refresh_bounds_s: tuple[float, float] = (2.0, 60.0)
        self._switching = anyio.Lock()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} id={self.id!r} policy={str(self.policy)!r}>"

    def owned_by(self, environment: BaseEnvironment, owned: AsyncExitStack) -> None:
        """Called by `environment` once the sandbox is whole: it closes the session by
        unwinding `owned`, the undo of everything the open created."""
        self.environment = environment
        self.owned = owned

    def closing(self) -> AsyncExitStack | None:
        """Called by the environment's `close()`: marks the session closed and hands over
        what is left to unwind (None: nothing, or already handed over)."""
        self.closed = True
        owned, self.owned = self.owned, None
        return owned

    async def exec(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        timeout: float | None = None,
        stdin: str | bytes | None = None,
        on_output: OutputCallback | None = None,
        service: str | None = None,
    ) -> ExecResult:
        """Run `command` in the sandbox (the contract is in this module's docstring).

        `cwd` is relative to the session's working directory (or absolute); `env` is added
        to the session's environment; `user` None is the session's user; `timeout` None is
        the session's `default_timeout`; `on_output(stream, text)` (sync or async) gets the
        output while the command runs; `service` names one of the plan's services to run
        in instead of the sandbox. Final: providers implement `_exec(request)`.
        """
        # Every check and default, once for every provider; a bad value raises a
        # `ValueError` (a `ConfigError` but for the command) naming it, never an env value.
        request = ExecRequest(
            tuple(argv(command)),
            cwd=_cwd(cwd),
            env=_env(env),
            user=_user(user),
            timeout=self.default_timeout if timeout is None else _timeout(timeout),
            stdin=_stdin(stdin),
            on_output=_callback(on_output),
            output_limit=self.output_limit,
            service=self.service_name(service),
        )
        try:
            result = await self._exec(request)
        except Exception as exc:
            self._log_exec(request, error=type(exc).__name__)
            raise
        self._log_exec(
            request,
            returncode=result.returncode,
            timed_out=result.timed_out,
            duration_s=round(result.duration_s, 4),
        )
        return result

    def _log_exec(self, request: ExecRequest, **outcome: object) -> None:
        # Names of the env only: its values, like the command's arguments, may be secrets.
        event(
            log,
            "debug",
            "exec",
            sandbox=self.id,
            program=request.args[0],
            service=request.service,
            cwd=request.cwd,
            user=request.user,
            env=",".join(sorted(request.env)),
            timeout_s=request.timeout,
            **outcome,
        )

    @abc.abstractmethod
    async def _exec(self, request: ExecRequest) -> ExecResult:
        """Provider hook: run `request` under the contract of `exec`, whose arguments it
        holds already checked and normalized."""

    # -- processes the session owns ------------------------------------------------------

    async def start(
        self,
        command: Command,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        service: str | None = None,
        stdin: bool = False,
        pty: PtySize | None = None,
        name: str | None = None,
    ) -> Process:
        """Start `command` in the background; the `Process` once it runs in the sandbox.

        Arguments as for `exec`; `stdin=True` lets `proc.write` feed it; `pty` gives it a
        terminal of that size (its output then all `stdout`); `name` is a label
        `processes()` shows. The session owns it: `end_workload()` and `close()` kill it
        with everything it started. Final: providers implement `_process_manager`.
        """
        request = StartRequest(
            tuple(argv(command)),
            cwd=_cwd(cwd),
            env=_env(env),
            user=_user(user),
            service=self.service_name(service),
            stdin=_flag(stdin, "stdin"),
            pty=_pty(pty),
            name=_name(name),
            buffer_bytes=self.process_buffer_bytes,
        )
        if request.pty is not None and request.stdin:
            raise ConfigError("a process with a pty reads its terminal: give pty= without stdin")
        manager = await self._process_manager(request.service)
        id = await manager.start(request)
        event(
            log,
            "debug",
            "process started",
            sandbox=self.id,
            process=id,
            program=request.args[0],
            service=request.service,
            pty=request.pty is not None,
        )
        return Process(
            manager, id, name=request.name, stdin=request.stdin, pty=request.pty is not None
        )

    async def processes(self, *, service: str | None = None) -> list[ProcessInfo]:
        """The processes the session holds: running, and the last exited ones."""
        return await (await self._process_manager(self.service_name(service))).list()

    async def process(self, id: str, *, service: str | None = None) -> Process:
        """A handle on process `id` again (also one another harness process started);
        `ProcessNotFound` if the session holds none by that id."""
        manager = await self._process_manager(self.service_name(service))
        for info in await manager.list():
            if info.id == id:
                # What it was started with is the manager's to check: it refuses a write
                # to a process without stdin, a resize of one without a terminal.
                return Process(manager, id, name=info.name, stdin=True, pty=True)
        raise ProcessNotFound(f"session {self.id!r} holds no process {id!r}")

    async def shell(
        self,
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        service: str | None = None,
    ) -> Shell:
        """A persistent shell (`corral.core.shell`): `await shell.run(command)` keeps cwd,
        variables, functions and aliases from one command to the next."""
        from corral.core.shell import Shell  # it builds on this module

        request = StartRequest(
            ("sh",),
            cwd=_cwd(cwd),
            env=_env(env),
            user=_user(user),
            service=self.service_name(service),
            buffer_bytes=self.process_buffer_bytes,
        )
        manager = await self._process_manager(request.service)
        return await Shell.start(manager, request, self.output_limit)

    async def _process_manager(self, service: str | None) -> ProcessManager:
        """Provider hook: what serves the processes of the sandbox or of `service`."""
        raise FeatureUnsupported(
            f"{type(self).__name__} cannot run background processes (session.start)"
        )

    def service_name(self, service: object) -> str | None:
        """`service` checked against the plan's services (None: the sandbox itself)."""
        if service is None or (isinstance(service, str) and service in self.services):
            return service
        env = self.environment
        if env is not None and not env.supports_services:
            raise FeatureUnsupported(
                f"provider {env.id!r} has no services (service={service!r} was given)"
            )
        known = ", ".join(self.services) or "none"
        raise ConfigError(f"session {self.id!r} has no service {service!r} (services: {known})")

    # The file calls are final, as `exec` is: each checks its paths and `service` once
    # (`service_name`: None is the sandbox itself) and hands them to the provider's
    # `_upload`, `_download`, `_upload_dir` or `_download_dir`.
    async def upload(self, local: str | Path, remote: str, *, service: str | None = None) -> None:
        """Copy the file `local` to `remote` in the sandbox (or in `service`), making its
        parent directories; an existing file is replaced."""
        await self._upload(_local(local), _remote(remote), self.service_name(service))

    async def download(
        self,
        remote: str,
        local: str | Path,
        *,
        service: str | None = None,
        max_bytes: int | None = DOWNLOAD_LIMIT_BYTES,
    ) -> None:
        """Copy the file `remote` to `local`. A file over `max_bytes` (None: no limit) is
        refused with `TransferLimitExceeded`, its size measured on corral's side (the
        engine, the transfer itself), never by the sandbox's own tools."""
        if max_bytes is not None and max_bytes < 0:
            raise ConfigError(f"max_bytes must be None or a whole number >= 0, not {max_bytes!r}")
        await self._download(_remote(remote), _local(local), self.service_name(service), max_bytes)

    async def upload_dir(
        self, local_dir: str | Path, remote_dir: str, *, service: str | None = None
    ) -> None:
        """Copy the tree `local_dir` into `remote_dir` (made if missing); a link in it that
        points outside it is refused (`UnsafeArchiveMember`) before anything is sent."""
        await self._upload_dir(_local(local_dir), _remote(remote_dir), self.service_name(service))

    async def download_dir(
        self, remote_dir: str, local_dir: str | Path, *, service: str | None = None
    ) -> None:
        """Copy the tree `remote_dir` into `local_dir`: what the sandbox sends is checked
        member by member, and nothing, through any chain of links, lands outside
        `local_dir` (`UnsafeArchiveMember`)."""
        await self._download_dir(_remote(remote_dir), _local(local_dir), self.service_name(service))

    @abc.abstractmethod
    async def _upload(self, local: Path, remote: str, service: str | None) -> None:
        """`upload`, its arguments checked: `remote` a non-empty path (relative to the
        sandbox's working directory unless absolute), `service` one of the plan's."""

    @abc.abstractmethod
    async def _download(
        self, remote: str, local: Path, service: str | None, max_bytes: int | None
    ) -> None:
        """`download`, its arguments checked."""

    @abc.abstractmethod
    async def _upload_dir(self, local_dir: Path, remote_dir: str, service: str | None) -> None:
        """`upload_dir`, its arguments checked."""

    @abc.abstractmethod
    async def _download_dir(self, remote_dir: str, local_dir: Path, service: str | None) -> None:
        """`download_dir`, its arguments checked."""

    def resolve_path(self, path: str) -> str:
        """`path` as the sandbox's own commands must be given it: itself where the sandbox
        has its own filesystem; on `local`, where the session's root holds it."""
        return path

    #: the argv prefix of corral's own file tools in the sandbox (its busybox, from where
    #: the workload cannot write); empty where there is no such copy and the sandbox's
    #: `rm` is the host's own
    _tools: tuple[str, ...] = ()

    async def remove(self, path: str) -> None:
        """Remove `path` in the sandbox, a file or a whole tree; a missing path is no error.
        What removes it is corral's own `rm`, never one the workload could replace."""
        result = await self.exec([*self._tools, "rm", "-rf", "--", path])
        if not result.ok:
            raise ProviderError(f"cannot remove {path!r} in the sandbox: {result.stderr.strip()}")

    async def write_text(self, path: str, text: str, *, service: str | None = None) -> None:
        """Write `text` (UTF-8) to the file `path`, as `upload` would."""
        with tempfile.TemporaryDirectory(prefix="corral-") as tmp:
            local = Path(tmp) / "file"
            await anyio.Path(local).write_text(text, encoding="utf-8")
            await self.upload(local, path, service=service)

    async def read_text(
        self,
        path: str,
        *,
        service: str | None = None,
        max_bytes: int | None = READ_TEXT_LIMIT_BYTES,
    ) -> str:
        """The file `path` as text (UTF-8, invalid bytes replaced); a file over `max_bytes`
        is refused (`TransferLimitExceeded`) before the harness holds it."""
        with tempfile.TemporaryDirectory(prefix="corral-") as tmp:
            local = Path(tmp) / "file"
            await self.download(path, local, service=service, max_bytes=max_bytes)
            data = await anyio.Path(local).read_bytes()
        return data.decode("utf-8", errors="replace")

    async def endpoint(self, port: int) -> str | None:
        """A URL reachable from the caller for `port` in the sandbox, or None."""
        return None

    async def host_gateway(self) -> str | None:
        """The address at which the sandbox reaches the caller's host, or None."""
        return None

    async def set_network_policy(
        self, policy: NetworkPolicy | str, *, phase: Phase | None = None
    ) -> None:
        """Switch the policy in force, atomically; on failure fall back to no network.

        `phase` (given by `TaskRun`) names what the policy is for: refused attempts are
        stamped with it (`network_events()`). The same policy under a new phase is not
        applied again; only what stamps events learns the new phase.
        """
        new = NetworkPolicy.model_validate(policy)
        env = self.environment
        if env is None or self.closed:
            raise NetworkPolicyUnsupported(f"session {self.id!r} is closed")
        caps = env.network_capabilities()
        if not caps.dynamic:
            if new == self.policy:
                if phase is not None:
                    self.phase = phase
                return
            raise NetworkPolicyUnsupported(
                f"provider {caps.provider!r} cannot switch the policy of a live sandbox "
                f"(from {self.policy} to {new})"
            )
        caps.check_policy(new, phase or "run")
        async with self._switching:
            if phase is not None and phase != self.phase:
                self.phase = phase
                if new == self.policy:
                    await self._phase_changed()
                    return
            await self._switch_to(new)

    async def _phase_changed(self) -> None:  # noqa: B027 - a hook most providers skip
        """Provider hook: `self.phase` changed under the same policy (relabel events)."""

    def network_events(self) -> NetworkEvents:
        """The refused attempts so far (`time`, `phase`, `protocol`, `destination`,
        `port`), oldest first, the newest `limit` of them kept (`dropped` counts the rest).
        `FeatureUnsupported` where the provider cannot see refusals."""
        raise FeatureUnsupported(
            f"{type(self).__name__} cannot report denied-egress events (network_events)"
        )

    async def _switch_to(self, new: NetworkPolicy) -> None:
        started = anyio.current_time()
        try:
            await self._apply_network_policy(new)
        except BaseException as failure:
            outcome = "the session was closed"
            with anyio.CancelScope(shield=True):
                outcome = await self._fail_closed(failure)
            if isinstance(failure, Exception):
                failure.add_note(f"corral: switching to {new} failed; {outcome}")
            raise
        self.policy = new
        event(
            log,
            "info",
            "network policy applied",
            sandbox=self.id,
            mode=new.network_mode.value,
            duration_s=round(anyio.current_time() - started, 4),
        )

    async def end_workload(self) -> None:
        """Kill every process running in the sandbox and show, from outside, they are gone.

        What the sandbox keeps is its filesystem and the process that holds it open (the
        container's init, or `plan.command`, which starts again). Called by `TaskRun` when
        a phase ends, so nothing the agent left running (detached, `setsid`, renamed,
        double-forked, root or not) lives on under the next policy. Raises
        `WorkloadNotStopped` when it cannot prove it; the session is then closed.
        """
        if self.closed:
            raise WorkloadNotStopped(f"session {self.id!r} is closed")
        started = anyio.current_time()
        try:
            await self._end_workload()
        except WorkloadNotStopped as exc:
            await self._close_after(f"{exc}")
            raise
        event(
            log,
            "info",
            "workload ended",
            sandbox=self.id,
            duration_s=round(anyio.current_time() - started, 4),
        )

    async def _end_workload(self) -> None:
        """Provider hook: kill everything in the sandbox, verify it from a trusted view."""
        raise FeatureUnsupported(f"{type(self).__name__} cannot end a phase's processes")

    async def save(self) -> SnapshotRef:
        """Persist the sandbox's state (files, not processes or policy) and return a
        reference `BaseEnvironment.fork` starts from. `FeatureUnsupported` where the
        provider cannot."""
        if self.closed:
            raise ProviderError(f"session {self.id!r} is closed; there is nothing to save")
        started = anyio.current_time()
        ref = await self._save()
        event(
            log,
            "info",
            "sandbox saved",
            sandbox=self.id,
            snapshot=ref.id,
            duration_s=round(anyio.current_time() - started, 3),
        )
        return ref

    async def _save(self) -> SnapshotRef:
        """Provider hook: persist the state, labelled to expire like the provider's other
        resources."""
        raise FeatureUnsupported(f"{type(self).__name__} cannot save a snapshot")

    async def _close_after(self, reason: str) -> None:
        env = self.environment
        event(log, "error", "closing the session", sandbox=self.id, reason=reason)
        if env is not None:
            with anyio.CancelScope(shield=True):
                await env.close(self)

    async def refresh_names(self) -> float | None:
        """Resolve the hostnames of the policy in force again and, if their addresses
        moved, apply the policy again (atomically, as any switch). Returns the seconds
        until the next refresh is due, or None when no hostname is in force.

        A refresh that fails leaves the sandbox with no network, like a failed switch.
        """
        async with self._switching:
            if self.closed:
                return None
            try:
                due = await self._refresh_names()
            except Exception as failure:
                outcome = "the session was closed"
                with anyio.CancelScope(shield=True):
                    outcome = await self._fail_closed(failure)
                event(log, "error", "re-resolving failed", sandbox=self.id, outcome=outcome)
                return None
        if due is None:
            return None
        low, high = self.refresh_bounds_s
        return min(max(due, low), high)

    async def _refresh_names(self) -> float | None:
        """Provider hook: re-resolve and re-apply if needed; seconds until due, or None."""
        return None

    @asynccontextmanager
    async def names_kept_current(self) -> AsyncGenerator[None]:
        """While the block runs, hostnames in force follow their DNS answers (TTLs)."""
        async with anyio.create_task_group() as group:
            group.start_soon(self._keep_refreshing)
            try:
                yield
            finally:
                group.cancel_scope.cancel()

    async def _keep_refreshing(self) -> None:
        while not self.closed:
            due = await self.refresh_names()
            # No hostname in force now: look again later, a switch may bring some.
            await anyio.sleep(due if due is not None else self.refresh_bounds_s[1])

    async def _fail_closed(self, failure: BaseException) -> str:
        """After a failed switch: no network at all, or, if even that fails, closed."""
        if self.closed:
            return "the session was closed"
        fallback = NetworkPolicy.no_network()
        try:
            with anyio.fail_after(FALLBACK_TIMEOUT_S):
                await self._apply_network_policy(fallback)
        except Exception as exc:
            await self._close_after(f"applying no-network after a failed switch: {exc!r}")
            return "applying no-network failed too, so the session was closed"
        if self.closed:
            return "the session was closed"
        self.policy = fallback
        event(
            log,
            "error",
            "switch failed; the sandbox has no network",
            sandbox=self.id,
            error=repr(failure),
        )
        return "the sandbox now has no network"

    async def _apply_network_policy(self, policy: NetworkPolicy) -> None:
        """Provider hook: enforce `policy` atomically, verify it, or raise."""
        raise NetworkPolicyUnsupported(f"{type(self).__name__} cannot switch network policy")

    async def fail_enforcement(self, message: str) -> None:
        """A probe got through: close this session, then raise."""
        env = self.environment
        if env is not None:
            await env.close(self)
        raise NetworkPolicyNotEnforced(f"sandbox {self.id}: {message}; the session was closed")


#: the calls a provider's session implements as `_name` and never overrides
_FINAL = ("exec", "upload", "download", "upload_dir", "download_dir")


def _remote(path: object) -> str:
    """A sandbox path as the file calls take it: a non-empty string without NUL."""
    if not isinstance(path, str) or not path or "\0" in path:
        raise ConfigError(f"a sandbox path must be a non-empty string without NUL, not {path!r}")
    return path


def _local(path: object) -> Path:
    """A path on the harness's side, as a Path."""
    if isinstance(path, Path):
        return path
    if not isinstance(path, str) or not path or "\0" in path:
        raise ConfigError(f"a local path must be a non-empty str or Path, not {path!r}")
    return Path(path)
