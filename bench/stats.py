"""Statistics every benchmark shares: percentiles, one-line summaries, Prometheus histogram quantiles."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile; nan without values."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(values: Sequence[float], unit: str, *, digits: int = 1) -> str:
    """``p50 .., p95 .., p99 .. (n=..)``."""
    if not values:
        return "no samples"
    return (f"p50 {statistics.median(values):.{digits}f} {unit}, p95 {percentile(values, 95):.{digits}f} {unit}, "
            f"p99 {percentile(values, 99):.{digits}f} {unit}  (n={len(values)})")


def spread(values: Sequence[float], unit: str = "ms", *, digits: int = 1) -> str:
    """``p50 .., p95 .., max .. (n=..)``."""
    if not values:
        return "no samples"
    return (f"p50 {statistics.median(values):.{digits}f} {unit}, p95 {percentile(values, 95):.{digits}f} {unit}, "
            f"max {max(values):.{digits}f} {unit} (n={len(values)})")


def histogram_quantile(buckets: Mapping[float, float], q: float) -> float:
    """The ``q``-th percentile of a Prometheus histogram from its cumulative bucket counts
    (upper bound -> count, +Inf included), interpolated inside the bucket as Prometheus does;
    nan when it is empty, the last finite bound when the percentile falls in +Inf."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return float("nan")
    rank = q / 100.0 * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = bound, count
    return lower
