"""AgentCompass's Docker provider on the exec and open cases: skipped in this environment.

AgentCompass (1.0.1 on PyPI) requires Python >= 3.12; corral's environment, in which the
benchmarks run, is Python 3.11, where `pip index versions agentcompass` finds no matching
distribution. Running its provider means a second, 3.12 environment driving the same
engine; the row says so rather than comparing against something else.
"""

from __future__ import annotations

from bench.context import Context
from bench.report import Row

REASON = (
    "skipped: agentcompass 1.0.1 needs Python >= 3.12 and this environment is 3.11 "
    "(`pip index versions agentcompass`: no matching distribution here)"
)


async def run(ctx: Context) -> list[Row]:
    return [Row("agentcompass docker: exec, open", note=REASON)]
