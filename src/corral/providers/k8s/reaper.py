"""Ending a phase's processes in a sandbox Pod, from a container the sandbox cannot touch.

`Reaper.end_workload` adds an ephemeral container of corral's own image (`probe_image`,
busybox) to the Pod, in the sandbox container's PID namespace (`targetContainerName`). Its
script (below):

1. calls `kill(-1, SIGKILL)` (ash's `kill` builtin, so the caller is the script itself),
   where it is in that namespace (see below for where it is not).
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

Where the reaper lands is checked, not assumed: PID 1 of its namespace must be the
sandbox container's (its root holds corral's programs at `/.corral`, mounted in no other
container). Not every runtime honours `targetContainerName`: under gVisor's runsc every
container of a Pod reports the sandbox process's pid, so the target's `/proc/<pid>/ns/pid`
that containerd names is the sandbox process's own, and runsc (`fixPidns`) then drops the
PID namespace from the spec: the reaper runs in the root PID namespace of the Pod's
kernel, where `kill(-1)` reached every container (sandbox, probe and services exited 137).
There the reaper takes the sandbox container's namespace from its first process (the
earliest started of those in another PID namespace than the reaper's whose root holds
`/.corral`; the workload cannot nest namespaces, it holds no CAP_SYS_ADMIN) and sends
SIGKILL to each process of that namespace but its init, round after round, until the
kernel's table shows none; never `kill(-1)`.

Nor is the reaper's word alone the verdict: the Pod's containers as the API server lists
them after it (the kubelet's view, from the runtime) must be the same as before, each still
running, never restarted, so a sweep that reached past the sandbox's processes fails.
"""

from __future__ import annotations

import secrets
from typing import Any

import anyio
from kubernetes.client.exceptions import ApiException

from corral.errors import WorkloadNotStopped
from corral.providers.k8s.api import call, explain, idempotent
from corral.providers.k8s.execution import Target
from corral.providers.k8s.pod import CONTAINER, FATAL_WAITING, PROGRAMS

CAP_SYS_PTRACE = 19
EXIT_CLEAN = 0
# $1: tries (every 0.1 s) before giving up. Exit 0 clean, 1 processes left, 2 untrusted,
# 3 no sandbox container found. `ns` empty: the reaper is in the sandbox's namespace and
# `kill(-1)` (atomic with respect to fork) is the kill; else only processes of the PID
# namespace `ns` are sent SIGKILL, one by one, round after round.
_REAP = f"""
me=$$
tries=$1
init=1
ns=
if [ ! -e /proc/1/root{PROGRAMS}/busybox ]; then
  init=
  mine=$(readlink /proc/$me/ns/pid)
  for dir in /proc/[0-9]*; do
    pid=${{dir#/proc/}}
    [ -e "$dir/root{PROGRAMS}/busybox" ] || continue
    [ "$(readlink "$dir/ns/pid")" != "$mine" ] || continue
    read -r stat 2>/dev/null <"$dir/stat" || continue
    set -- ${{stat##*") "}}
    if [ -z "$init" ] || [ "${{20}}" -lt "$first" ] || \
      {{ [ "${{20}}" = "$first" ] && [ "$pid" -lt "$init" ]; }}; then
      init=$pid
      first=${{20}}
    fi
  done
  [ -n "$init" ] && ns=$(readlink "/proc/$init/ns/pid")
  if [ -z "$ns" ]; then
    echo "found no process of the sandbox container (none has {PROGRAMS} in its root)" \
      >/dev/termination-log
    exit 3
  fi
else
  kill -9 -1 2>/dev/null
fi
bounding=ffffffffffffffff
while read -r key value; do [ "$key" = CapBnd: ] && bounding=$value; done </proc/$init/status
if [ $(( 0x$bounding >> {CAP_SYS_PTRACE} & 1 )) = 1 ]; then
  echo "the sandbox holds CAP_SYS_PTRACE, so it could forge the reaper's verdict" \
    >/dev/termination-log
  exit 2
fi
while :; do
  left=
  for dir in /proc/[0-9]*; do
    pid=${{dir#/proc/}}
    [ "$pid" = "$init" ] || [ "$pid" = "$me" ] && continue
    [ -z "$ns" ] || [ "$(readlink "$dir/ns/pid")" = "$ns" ] || continue
    read -r stat 2>/dev/null <"$dir/stat" || continue
    set -- ${{stat##*") "}}
    [ "$1" = Z ] || [ "$1" = X ] || [ "$2" = "$me" ] || left="$left $pid"
  done
  if [ -z "$left" ]; then echo clean >/dev/termination-log; exit 0; fi
  tries=$((tries - 1))
  if [ "$tries" -le 0 ]; then echo "still alive:$left" >/dev/termination-log; exit 1; fi
  if [ -z "$ns" ]; then kill -9 -1 2>/dev/null; else kill -9 $left 2>/dev/null; fi
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
            before = _containers(await self._pod())
            code, message = await self.run(_REAP, str(tries))
            after = _containers(await self._pod())
        if code != EXIT_CLEAN:
            raise WorkloadNotStopped(
                f"Pod {self.target.pod}: the reaper exited {code}: {message.strip()}"
            )
        changed = sorted(name for name in before if after.get(name) != before[name])
        if changed:
            raise WorkloadNotStopped(
                f"Pod {self.target.pod}: the reaper reported clean, but container(s) "
                f"{', '.join(changed)} did not keep running as they were: "
                + "; ".join(f"{n}: {before[n]} -> {after.get(n, 'gone')}" for n in changed)
            )

    async def _pod(self) -> Any:
        return await idempotent(
            self.target.tokens,
            self.target.clients.core.read_namespaced_pod,
            self.target.pod,
            self.target.namespace,
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
            pod = await self._pod()
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


def _containers(pod: Any) -> dict[str, str]:
    """Each of the Pod's containers (not the ephemeral ones) as the kubelet reports it:
    its runtime id, restarts, and whether it runs; what a reaper must leave as it was."""
    statuses: list[Any] = pod.status.container_statuses or []
    return {
        status.name: (
            f"{status.container_id} restarts={status.restart_count} "
            f"{'running' if status.state is not None and status.state.running else 'not running'}"
        )
        for status in statuses
    }
