"""A harness that opens sandboxes and never closes them, for the tests that SIGKILL it.

    python -m tests.integration.abandoned_harness ENV_ID CONFIG_JSON IMAGE COUNT

Opens COUNT sandboxes at once, with the config's `default_lifetime_s` (the plan sets no
`max_lifetime_s`), prints their ids as one JSON line, then blocks until killed.
`kill_harness` runs it as a real child process and SIGKILLs it once the ids are out.
"""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from corral import ENVIRONMENTS, EnvironmentSession, ExecutionPlan

ROOT = Path(__file__).parents[2]


async def main(argv: list[str]) -> None:
    env_id, config, image, count = argv
    env = ENVIRONMENTS.create(env_id, **json.loads(config))
    plan = ExecutionPlan(image=image)
    opened: list[EnvironmentSession] = []

    async def open_one() -> None:
        opened.append(await env.open(plan))

    async with anyio.create_task_group() as tg:
        for _ in range(int(count)):
            tg.start_soon(open_one)
    print(json.dumps([session.id for session in opened]), flush=True)
    await anyio.sleep_forever()


def kill_harness(
    env_id: str, config: dict[str, Any], image: str, count: int
) -> tuple[list[str], float]:
    """The ids of the sandboxes a harness opened, and the monotonic time it was SIGKILLed."""
    argv = [sys.executable, "-m", "tests.integration.abandoned_harness", env_id]
    argv += [json.dumps(config), image, str(count)]
    child = subprocess.Popen(
        argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], 60)
        line = child.stdout.readline() if ready else ""
    finally:
        child.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        child.wait()
    if not line:
        stderr = child.stderr.read() if child.stderr else ""
        raise AssertionError(f"the harness opened nothing (exit {child.returncode}): {stderr}")
    assert child.returncode == -signal.SIGKILL, child.returncode
    ids: list[str] = json.loads(line)
    assert len(ids) == count, line
    return ids, killed_at


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
