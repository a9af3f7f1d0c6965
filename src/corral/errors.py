"""Error types. Each message names the bad value and what to do about it."""

from __future__ import annotations

import errno


class CorralError(Exception):
    """Base of every error corral raises on purpose."""


class ConfigError(CorralError, ValueError):
    """A config, plan or argument that cannot be used as given."""


class ImageRequired(ConfigError):
    """A provider that runs images was given a plan that names none."""


class ExecUserRefused(ConfigError):
    """`exec(user=...)` named a user the sandbox does not have, or one it does not run
    commands as (`local` runs every command as its one user)."""


class ProviderError(CorralError):
    """The provider or its transport failed (engine down, API error, lost stream)."""


class ExecUserUnsupported(ProviderError):
    """`exec(user=...)` asked for a user switch the provider cannot make."""


class StartupTimeout(ProviderError, TimeoutError):
    """`open()` did not finish within `timeouts.startup_s`."""


class AdmissionTimeout(StartupTimeout):
    """An open waited `admission_max_wait_s` to be admitted (host load, the shared open
    rate) and was not; the message names what it waited for."""


class RemotePathNotFound(CorralError, FileNotFoundError):
    """A path inside the sandbox does not exist."""

    def __init__(self, path: str) -> None:
        # OSError's (errno, strerror, filename) form keeps message and path in str().
        super().__init__(errno.ENOENT, "no such file or directory in the sandbox", path)


class UnsafeArchiveMember(CorralError, ValueError):
    """A directory transfer would have written outside its root."""


class TransferLimitExceeded(CorralError, ValueError):
    """A transfer carried more than its limits allow; it was refused whole."""


class NetworkPolicyUnsupported(CorralError, ValueError):
    """A policy asks for something the provider cannot enforce."""


class NetworkPolicyNotEnforced(CorralError):
    """A probe got through a policy that should have stopped it; the session was closed."""


class WorkloadNotStopped(ProviderError):
    """The processes a phase started could not be killed, or not shown gone."""


class FeatureUnsupported(CorralError):
    """The provider cannot serve this call; the message names the feature."""


class SessionNotFound(CorralError, LookupError):
    """No live sandbox of this provider and owner carries the session id."""

    def __init__(self, session_id: str, detail: str = "") -> None:
        self.session_id = session_id
        super().__init__(f"no live sandbox has session_id {session_id!r}{detail}")


class ProcessNotFound(CorralError, LookupError):
    """The session holds no process by this id (never started, or long exited and let go,
    or its sandbox's processes were ended)."""


class SessionIdTaken(ProviderError):
    """Another open created a sandbox with this session id first (it may still be starting)."""


class WorkspaceBusy(CorralError):
    """A live binding already holds this source or sandbox path (or one inside it)."""


class SyncBindingSourceConflictError(CorralError, RuntimeError):
    """Sync-back refused because the host source changed since bind."""

    def __init__(self, path: str, *, applied_paths: tuple[str, ...] = (), detail: str = "") -> None:
        self.path = path
        self.applied_paths = applied_paths
        super().__init__(
            f"the source {path!r} changed since it was bound{detail}; "
            f"{len(applied_paths)} path(s) were applied before stopping"
        )
