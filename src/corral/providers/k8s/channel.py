"""The exec channel on Kubernetes: the helper reached over one long-lived websocket exec.

The protocol, the bookkeeping of each call and the fallbacks are `corral.helper.channel`'s;
this module is the transport and the start. On the first exec corral streams its helper
(`corral.helper`, a static binary, in a tar) into the Pod's programs volume through the
probe container (corral's image and busybox; the sandbox has that volume read-only, see
`pod.PROGRAMS`), renamed into place whole, then starts it in the sandbox container from
there with one websocket exec with stdin. Each later command
is a frame on that websocket's stdin channel; the helper's frames come back on its stdout
channel, its own diagnostics on stderr, the stream's end status on the error channel.

Kubernetes cannot exec as another user, and neither does the helper here: it runs each
command as itself (the container's user, groups and environment, as a plain exec does).

The websocket after its handshake is `websocket.WebSocketTransport`, driven by the
channel's reader thread.

Fallbacks (plain exec for the session's life, logged once): no binary for the node's
architecture, a copy that fails (a full volume), a helper that does not start or answer.
A connection to the API server that fails while the helper starts fails that call
(`ProviderError`), as it would fail a plain exec; the next call tries again.
"""

from __future__ import annotations

import functools
import logging
import secrets
from collections.abc import Callable
from typing import Any

import anyio
from anyio.lowlevel import EventLoopToken
from kubernetes.client.exceptions import ApiException

from corral.core.output import BoundedOutput
from corral.core.session import ExecRequest, ExecResult
from corral.errors import ProviderError
from corral.helper import helper_archive, helper_binary, no_helper
from corral.helper.channel import Channel, PlainExecutor
from corral.helper.channel import ChannelExecutor as _ChannelExecutor
from corral.helper.link import ChannelUnavailable, L, Transport, greeted
from corral.providers.k8s import probe
from corral.providers.k8s.api import call
from corral.providers.k8s.execution import (
    Target,
    connect,
    exit_code,
    kill,
    run_blocking_exec,
    run_exec,
    run_own,
)
from corral.providers.k8s.pod import PROGRAMS, PROGRAMS_RW

log = logging.getLogger("corral.k8s.channel")

# `head -c` bounds what tar reads: the v4 protocol cannot close stdin. Unpacked under a
# fresh name, then renamed over the helper: one running keeps its own file.
#: The same helper already there stays: a process manager running from it (another
#: harness's) is then still the program at that path, which its clients check.
_COPY = (
    'busybox head -c "$1" | busybox tar -x -f - -C "$2" && busybox chmod 555 "$2/$3" && '
    'if busybox cmp -s "$2/$3" "$2/$4"; then busybox rm -f "$2/$3"; '
    'else busybox mv -f "$2/$3" "$2/$4"; fi'
)
_HELPER = "corral-exec"
#: the helper as corral's probe container sees it (the programs volume, read-write there)
PROBE_HELPER = f"{PROGRAMS_RW}/{_HELPER}"


class ChannelExecutor(_ChannelExecutor):
    """Execs through a helper in the sandbox container; plain websocket exec where it
    cannot."""

    def __init__(self, target: Target, sandbox_id: str, *, copied: bool = False) -> None:
        self.target = target
        self.plain = PlainExecutor(functools.partial(run_exec, target))
        super().__init__(self.plain, sandbox_id, log)
        #: the helper is in the programs volume: this executor, or this process's making
        #: of the Pod (a warm pool's fill) before the workload could run, copied it there
        self.copied = copied

    async def run(self, request: ExecRequest) -> ExecResult:
        try:
            return await super().run(request)
        except ProviderError as exc:
            if type(exc) is not ProviderError or not str(exc).startswith("the exec channel"):
                raise
            raise ProviderError(f"exec in Pod {self.target.pod}: {exc}") from None

    def _placement(self, request: ExecRequest) -> tuple[str | None, str]:
        # As the helper itself (the container's user); "" is the container's working dir.
        return None, request.cwd or ""

    async def _kill_fallback(self, marker: str, user: str | None) -> None:
        await kill(self.target, marker)

    async def _arch(self) -> str:
        """The node's architecture, from the API server; from `uname -m` in the container
        where corral may not read Nodes."""
        target = self.target
        try:
            pod: Any = await call(
                target.tokens, target.clients.core.read_namespaced_pod, target.pod, target.namespace
            )
            node: Any = await call(target.tokens, target.clients.core.read_node, pod.spec.node_name)
            return str(node.status.node_info.architecture)
        except (ApiException, ProviderError, AttributeError):
            found = await run_own(self.target, ["uname", "-m"])
            return found.stdout.strip()

    async def _copy(self, binary: Any) -> None:
        incoming = f".incoming-{secrets.token_hex(8)}"
        archive = await anyio.to_thread.run_sync(helper_archive, binary, incoming)
        stderr = BoundedOutput(4096)
        target = self.target
        # A lost connection raises ProviderError: this call fails, the next tries again.
        status, _ = await call(
            target.tokens,
            run_blocking_exec,
            target.sibling(probe.CONTAINER),
            ["sh", "-c", _COPY, "sh", str(len(archive)), PROGRAMS_RW, incoming, _HELPER],
            [archive],
            None,
            lambda stream, data: stderr.feed(data) if stream == "stderr" else None,
        )
        try:
            code = exit_code(status)
        except ProviderError as exc:  # the exec itself failed in the Pod
            raise ChannelUnavailable(
                f"copying the helper into the programs volume failed: {exc}"
            ) from None
        if code != 0:
            raise ChannelUnavailable(
                f"copying the helper into the programs volume failed (exit {code}): "
                f"{stderr.text().strip()[:300]}"
            )

    async def installed(self) -> str:
        """The path of corral's helper in the sandbox (the read-only programs volume),
        copied there once; ChannelUnavailable where this corral has none for the node."""
        if not self.copied:
            arch = await self._arch()
            binary = helper_binary(arch)
            if binary is None:
                raise ChannelUnavailable(no_helper(arch))
            await self._copy(binary)
            self.copied = True
        return f"{PROGRAMS}/{_HELPER}"

    async def _start(self, token: EventLoopToken) -> Channel:
        path = await self.installed()
        return await start_program(
            self.target,
            [path, path, "1"],
            lambda transport: Channel(transport, token, "k8s", self.target.tokens, self.sandbox_id),
        )


async def start_program(target: Target, argv: list[str], link: Callable[[Transport], L]) -> L:
    """One of corral's programs in the sandbox container over one websocket exec, once it
    said hello. Refused or lost, the API server fails this call as it would a plain exec
    (a ProviderError); ChannelUnavailable (having cleaned up) if it does not answer."""
    transport = await call(target.tokens, connect, target, argv, stdin=True)
    return await greeted(link(transport))
