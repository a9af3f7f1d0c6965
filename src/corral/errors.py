"""Error types. Each message names the bad value and what to do about it."""

from __future__ import annotations


class CorralError(Exception):
    """Base of every error corral raises on purpose."""


class ConfigError(CorralError, ValueError):
    """A config, plan or argument that cannot be used as given."""


class ProviderError(CorralError):
    """The provider or its transport failed (engine down, API error, lost stream)."""


class StartupTimeout(ProviderError, TimeoutError):
    """`open()` did not finish within `timeouts.startup_s`."""


class RemotePathNotFound(CorralError, FileNotFoundError):
    """A path inside the sandbox does not exist."""

    def __init__(self, path: str) -> None:
        super().__init__(f"no such file or directory in the sandbox: {path!r}")
        self.filename = path


class UnsafeArchiveMember(CorralError, ValueError):
    """A directory transfer would have written outside its root."""


class NetworkPolicyUnsupported(CorralError, ValueError):
    """A policy asks for something the provider cannot enforce."""


class NetworkPolicyNotEnforced(CorralError):
    """A probe got through a policy that should have stopped it; the session was closed."""
