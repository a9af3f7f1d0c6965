"""Rows of results, as a markdown table and as JSON."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bench.stats import Summary

Unit = Literal["s", "count", "KiB"]


@dataclass(frozen=True)
class Row:
    """One line of the table: corral beside a baseline, or a skip with its reason."""

    case: str
    corral: Summary | None = None
    baseline_name: str = ""
    baseline: Summary | None = None
    unit: Unit = "s"
    target: str = ""
    met: bool | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.corral is None or self.baseline is None or self.baseline.median == 0:
            return None
        return self.corral.median / self.baseline.median

    def as_json(self) -> dict[str, Any]:
        def summary(value: Summary | None) -> dict[str, Any] | None:
            if value is None:
                return None
            return {"median": value.median, "p95": value.p95, "samples": list(value.samples)}

        return {
            "case": self.case,
            "unit": self.unit,
            "corral": summary(self.corral),
            "baseline_name": self.baseline_name,
            "baseline": summary(self.baseline),
            "ratio": self.ratio,
            "target": self.target,
            "met": self.met,
            "note": self.note,
        }


def ratio_at_most(corral: Summary, baseline: Summary, limit: float) -> bool:
    """The issue's ratio targets compare medians."""
    return corral.median <= limit * baseline.median


def _value(value: float, unit: Unit) -> str:
    if unit == "count":
        return f"{value:g}"
    if unit == "KiB":
        return f"{value:.1f} KiB"
    if value >= 10:
        return f"{value:.1f} s"
    if value >= 1:
        return f"{value:.2f} s"
    return f"{value * 1000:.1f} ms"


def markdown(rows: Sequence[Row]) -> str:
    head = (
        "| case | corral p50 | corral p95 | baseline | baseline p50 | baseline p95 "
        "| ratio | target | met |\n|---|---:|---:|---|---:|---:|---:|---|---|"
    )
    lines = [head]
    for row in rows:
        c, b = row.corral, row.baseline
        met = {True: "yes", False: "**no**", None: "-"}[row.met]
        ratio = "-" if row.ratio is None else f"{row.ratio:.2f}x"
        cells = [
            row.case + (f" ({row.note})" if row.note else ""),
            "-" if c is None else _value(c.median, row.unit),
            "-" if c is None else _value(c.p95, row.unit),
            row.baseline_name or "-",
            "-" if b is None else _value(b.median, row.unit),
            "-" if b is None else _value(b.p95, row.unit),
            ratio,
            row.target or "-",
            met,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
