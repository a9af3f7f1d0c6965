"""How a person attaches to a corral sandbox (`inspect sandbox connection`, Inspect View)."""

from __future__ import annotations

import shlex

from inspect_ai.util import SandboxConnection

from corral.core.session import EnvironmentSession


def connection(session: EnvironmentSession, user: str | None) -> SandboxConnection:
    """A `docker exec` command for the docker provider; other providers have none yet."""
    env = session.environment
    if session.closed or env is None:
        raise ConnectionError(f"corral sandbox {session.id} is closed")
    if env.id != "docker":
        raise NotImplementedError(f"corral provider {env.id!r} offers no attach command")
    from corral.providers.docker import DockerConfig
    from corral.providers.docker.session import DockerSession

    assert isinstance(session, DockerSession) and isinstance(env.config, DockerConfig)
    args = ["docker"]
    if env.config.base_url:
        args += ["--host", env.config.base_url]
    args += ["exec", "-it"]
    if user:
        args += ["--user", user]
    args += [session.sandbox, "/bin/sh"]
    return SandboxConnection(type="corral", command=shlex.join(args), container=session.sandbox)
