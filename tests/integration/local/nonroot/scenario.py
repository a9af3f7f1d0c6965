"""A whole `TaskRun` on `local`, run by `test_local_nonroot.py` as a user who is not root.

argv: the port of a TCP server the test listens on (127.0.0.1), a marker the agent's
leftover process carries, and the host directory a binding names. Prints one JSON object.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio

from corral import EnvironmentSession, ExecutionPlan, NetworkSchedule, ProcessOutput, TaskRun
from corral.providers.local import LocalEnvironment
from corral.workspace import SyncBinding

PORT, MARKER, HOST_DIR = int(sys.argv[1]), sys.argv[2], sys.argv[3]
CONNECT = (
    "import socket,sys\n"
    "try:\n"
    f"    socket.create_connection(('127.0.0.1', {PORT}), timeout=3).close()\n"
    "except OSError as e:\n"
    "    sys.exit(f'refused: {e}')\n"
    "print('connected')\n"
)


async def main() -> dict[str, object]:
    assert os.geteuid() != 0, "the scenario must not run as root"
    source = Path(HOST_DIR).parent / "source"
    source.mkdir()
    (source / "task.txt").write_text("bound\n")
    out: dict[str, object] = {
        "modes": sorted(m.value for m in LocalEnvironment.supported_network_modes),
        "dynamic": LocalEnvironment.supports_dynamic_network_policy,
    }
    plan = ExecutionPlan(
        workdir=HOST_DIR,
        network=NetworkSchedule(baseline="public", run="no-network", evaluation="public"),
    )
    binding = SyncBinding(source=source, path=HOST_DIR)
    env = LocalEnvironment()
    async with TaskRun(env, plan, bindings=[binding]) as run:
        python = sys.executable
        out["baseline"] = (await run.session.exec([python, "-c", CONNECT])).stdout.strip()
        async with run.running() as sandbox:
            out["run_mode"] = sandbox.policy.network_mode.value
            run_try = await sandbox.exec([python, "-c", CONNECT])
            out["run"] = run_try.stdout.strip() or run_try.stderr.strip()
            out["run_uid"] = (await sandbox.exec(["id", "-u"])).stdout.strip()
            # The agent leaves a detached process behind, in a new session, renamed.
            detach = f"setsid sh -c 'sleep 600; echo {MARKER}' </dev/null >/dev/null 2>&1 &"
            await sandbox.exec(["sh", "-c", detach])
            await sandbox.exec("echo agent >> task.txt")
            # A background process and a persistent shell, in the session's namespaces.
            background = await sandbox.start(["sh", "-c", "echo up; sleep 601", MARKER])
            async for event in background:
                assert isinstance(event, ProcessOutput), event
                out["background"] = event.data.decode().strip()  # its first output
                break
            async with await sandbox.shell() as shell:
                await shell.run("cd / && export SEEN=kept")
                out["shell"] = (await shell.run('echo "$SEEN $PWD $(id -u)"')).stdout.strip()

        async def grade(session: EnvironmentSession) -> dict[str, object]:
            tried = await session.exec([python, "-c", CONNECT])
            # A bracket, so the pattern does not find the commands that carry it.
            left = await session.exec(["pgrep", "-f", f"[s]leep 60[01].*{MARKER}"])
            return {
                "evaluation": tried.stdout.strip(),
                "left_in_sandbox": left.stdout.split(),
                "background_exit": await background.wait(timeout=30),  # ended with the run
            }

        out.update(await run.evaluate(grade))
        out["policy_log"] = [mode for _, _, mode in run.policy_log]
        out["workspace"] = str(run.session.resolve_path("."))
    return out


def after() -> dict[str, object]:
    """What the host holds once the run is over."""
    return {
        "host_dir": sorted(p.name for p in Path(HOST_DIR).iterdir()),
        "synced": (Path(HOST_DIR).parent / "source" / "task.txt").read_text(),
    }


print(json.dumps(anyio.run(main) | after()))
