"""The campaign's summary table."""

from __future__ import annotations

from corral.testing.campaign.run import Report
from corral.testing.checkpoints import Outcome


def markdown(reports: list[Report]) -> str:
    """The campaign's summary: one row per provider and operation, a total per provider."""
    lines = [
        "| provider | operation | cases | faults injected | raised the cancellation "
        "| returned under a shield | slowest return after the cancel | failures (by cause) "
        "| leaks |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for provider in dict.fromkeys(r.provider for r in reports):
        mine = [r for r in reports if r.provider == provider]
        for name, group in [*((r.operation, [r]) for r in mine), ("**all**", mine)]:
            attempts = [a for r in group for a in r.attempts]
            failures = [p.cause for r in group for p in r.failures]
            causes = ", ".join(f"{failures.count(c)} {c}" for c in dict.fromkeys(failures))
            cells = [
                provider,
                name,
                len(attempts),
                sum(r.faults for r in group),
                sum(a.outcome is Outcome.CANCELLED for a in attempts),
                sum(a.outcome is Outcome.UNDELIVERED for a in attempts),
                f"{max((a.returned_after_s for a in attempts), default=0.0):.2f} s",
                causes or "0",
                sum(len(r.leaks) for r in group),
            ]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)
