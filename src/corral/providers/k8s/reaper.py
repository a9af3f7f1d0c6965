"""Ending a phase's processes in a sandbox Pod, from a container the sandbox cannot touch.

`Reaper.end_workload` adds an ephemeral container of corral's own image (`probe_image`,
busybox) to the Pod, in the sandbox container's PID namespace (`targetContainerName`). Its
script (below):

1. calls `kill(-1, SIGKILL)` (ash's `kill` builtin, so the caller is the script itself).
   The kernel sends it to every process of the namespace except its init and the caller,
   atomically with respect to fork, so nothing that double-forks, `setsid`s, renames
   itself or runs under another uid slips through.
2. reads the namespace's /proc, the kernel's view, until no process but PID 1 and its own
   children is alive (zombies are dead), killing again whatever it finds; bounded.

PID 1 is the one process that survives: a namespace's init cannot be sent SIGKILL from
inside it. Without a `plan.command` it is corral's gate shell, which never forks or execs
once the workload gate is open (see `pod.py`), so nothing can come back through it, not
even through a `/bin/sleep` the agent replaced.

The verdict is the reaper's exit code and termination message, both read from the API
server: the kubelet takes them from the runtime and from a file in the reaper's own mount
namespace. The sandbox can write neither, because it cannot ptrace the reaper nor open its
/proc/<pid>/root or fd/: the kernel allows that against a process of the same uid only if
the target's permitted capabilities are a subset of the caller's, or the caller holds
CAP_SYS_PTRACE. So the reaper runs with CAP_SYS_PTRACE (which it does not otherwise use)
beside CAP_KILL, and refuses to give a verdict when the sandbox holds CAP_SYS_PTRACE too.
The sandbox can still kill or stop the reaper before it sweeps; that is a failure, never a
clean verdict.
"""

from __future__ import annotations

import secrets
from typing import Any

import anyio
from kubernetes.client.exceptions import ApiException

from corral.errors import WorkloadNotStopped
from corral.providers.k8s.api import call, explain, idempotent
from corral.providers.k8s.execution import Target
from corral.providers.k8s.pod import CONTAINER, FATAL_WAITING

CAP_SYS_PTRACE = 19
EXIT_CLEAN = 0
# $1: tries (every 0.1 s) before giving up. Exit 0 clean, 1 processes left, 2 untrusted.
_REAP = f"""
me=$$
kill -9 -1 2>/dev/null
tries=$1
bounding=ffffffffffffffff
while read -r key value; do [ "$key" = CapBnd: ] && bounding=$value; done </proc/1/status
if [ $(( 0x$bounding >> {CAP_SYS_PTRACE} & 1 )) = 1 ]; then
  echo "the sandbox holds CAP_SYS_PTRACE, so it could forge the reaper's verdict" \
    >/dev/termination-log
  exit 2
fi
while :; do
  left=
  for dir in /proc/[0-9]*; do
    pid=${{dir#/proc/}}
    [ "$pid" = 1 ] || [ "$pid" = "$me" ] && continue
    read -r stat 2>/dev/null <"$dir/stat" || continue
    set -- ${{stat##*") "}}
    [ "$1" = Z ] || [ "$1" = X ] || [ "$2" = "$me" ] || left="$left $pid"
  done
  if [ -z "$left" ]; then echo clean >/dev/termination-log; exit 0; fi
  tries=$((tries - 1))
  if [ "$tries" -le 0 ]; then echo "still alive:$left" >/dev/termination-log; exit 1; fi
  kill -9 -1 2>/dev/null
  sleep 0.1
done
"""


class Reaper:
    """Kills every process of one sandbox Pod but its PID 1, and shows they are gone."""

    def __init__(self, target: Target, image: str, pull_policy: str, timeout_s: float) -> None:
        self.target = target
        self.image = image
        self.pull_policy = pull_policy
        self.timeout_s = timeout_s
        # Two reapers at once would kill each other: each is in the other's namespace.
        self._lock = anyio.Lock()

    async def end_workload(self) -> None:
        tries = max(1, int(self.timeout_s * 10))
        async with self._lock:
            code, message = await self.run(_REAP, str(tries))
        if code != EXIT_CLEAN:
            raise WorkloadNotStopped(
                f"Pod {self.target.pod}: the reaper exited {code}: {message.strip()}"
            )

    async def run(self, script: str, *args: str) -> tuple[int, str]:
        """Run busybox `sh -c script` in the sandbox's PID namespace, as the reaper does;
        returns its exit code and termination message."""
        name = f"corral-reaper-{secrets.token_hex(4)}"
        spec = {
            "name": name,
            "image": self.image,
            "imagePullPolicy": self.pull_policy,
            # The kubelet expands $(VAR) and turns $$ into $ in a command; $$ keeps a $.
            "command": [
                a.replace("$", "$$") for a in ("/bin/busybox", "sh", "-c", script, "reaper", *args)
            ],
            "targetContainerName": CONTAINER,
            "terminationMessagePolicy": "File",
            "securityContext": {
                "runAsUser": 0,
                "runAsNonRoot": False,
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"], "add": ["KILL", "SYS_PTRACE"]},
            },
        }
        await self._add(spec)
        with anyio.move_on_after(self.timeout_s):
            return await self._terminated(name)
        raise WorkloadNotStopped(
            f"Pod {self.target.pod}: the reaper {name} gave no verdict in {self.timeout_s:.0f} s"
        )

    async def _add(self, spec: dict[str, Any]) -> None:
        body = {"spec": {"ephemeralContainers": [spec]}}
        try:
            await call(
                self.target.tokens,
                self.target.clients.core.patch_namespaced_pod_ephemeralcontainers,
                self.target.pod,
                self.target.namespace,
                body,
                _content_type="application/strategic-merge-patch+json",
            )
        except ApiException as exc:
            raise WorkloadNotStopped(
                f"cannot add the reaper container to Pod {self.target.pod}: {explain(exc)}. "
                "Ending a phase's processes on k8s needs ephemeral containers (Kubernetes "
                ">= 1.25) and the RBAC verb `patch` on pods/ephemeralcontainers"
            ) from None

    async def _terminated(self, name: str) -> tuple[int, str]:
        delay = 0.05
        while True:
            pod: Any = await idempotent(
                self.target.tokens,
                self.target.clients.core.read_namespaced_pod,
                self.target.pod,
                self.target.namespace,
            )
            if pod.status.phase in ("Failed", "Succeeded"):
                raise WorkloadNotStopped(
                    f"Pod {self.target.pod} has ended (phase {pod.status.phase})"
                )
            statuses: list[Any] = pod.status.ephemeral_container_statuses or []
            for status in statuses:
                if status.name != name or status.state is None:
                    continue
                waiting: Any = status.state.waiting
                if waiting is not None and waiting.reason in FATAL_WAITING:
                    raise WorkloadNotStopped(
                        f"the reaper container cannot start in Pod {self.target.pod}: "
                        f"{waiting.reason} for image {self.image!r} (config probe_image): "
                        f"{waiting.message or ''}".strip()
                    )
                done: Any = status.state.terminated
                if done is not None:
                    return int(done.exit_code), str(done.message or "")
            await anyio.sleep(delay)
            delay = min(delay * 2, 0.25)
