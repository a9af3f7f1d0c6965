"""Median and p95 of samples taken after warm-up."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Summary:
    median: float
    p95: float
    samples: tuple[float, ...]


def summarize(samples: Sequence[float]) -> Summary:
    """Nearest-rank p95; `samples` are kept in the order they were taken."""
    if not samples:
        raise ValueError("no samples to summarize")
    ordered = sorted(samples)
    p95 = ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]
    return Summary(statistics.median(ordered), p95, tuple(samples))
