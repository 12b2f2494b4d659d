"""A Prometheus-style histogram kept in plain Python: bucket counts and a sum.

Written on the event loop only (its one writer); `proxy.ops.metrics` copies the counts when
scraped. Here, below the metrics module, so that the core can count without importing
prometheus_client.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

__all__ = ["Histogram"]


class Histogram:
    """Bucket counts and a sum, in plain Python (the loop is the only writer)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # bucket i: value <= bounds[i]
        self.total += value
