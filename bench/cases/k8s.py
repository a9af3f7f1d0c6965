"""Kubernetes rows: STUB, skipped while the k8s provider is being written.

To add them: a case module like `docker_exec`/`docker_open` taking a k8s Context (an
environment from `ENVIRONMENTS.create("k8s", ...)` and a raw `kubernetes` client as the
baseline), registered in `bench.cases.CASES`; `Row` and the table need no change.
"""

from __future__ import annotations

from bench.context import Context
from bench.report import Row

REASON = "skipped: STUB, the k8s provider is being written; rows will be exec, open, transfer"


async def run(ctx: Context) -> list[Row]:
    return [Row("k8s: exec, open, transfer, policy", note=REASON)]
