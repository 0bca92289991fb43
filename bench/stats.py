"""Percentiles for benchmark reports."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(values: Sequence[float], unit: str, *, digits: int = 1) -> str:
    if not values:
        return "no samples"
    return (f"p50 {statistics.median(values):.{digits}f} {unit}, p95 {percentile(values, 95):.{digits}f} {unit}, "
            f"p99 {percentile(values, 99):.{digits}f} {unit}  (n={len(values)})")
