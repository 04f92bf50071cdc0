"""One strategy's step over another's from `bench tree` rows (the bench's summary and chapter 14 alike)."""
from __future__ import annotations

import statistics
from collections.abc import Mapping


def step_ratio(a: Mapping, b: Mapping, key: str = "graph_step_ms") -> float:
    """Row a's `key` over row b's: the median of the per-repeat ratios when both rows carry their repeats
    (`<key>_reps`, repeat i of both taken back to back: one repeat's ratio cancels what drifts between
    repeats) in equal number, else the ratio of the medians."""
    ra, rb = a.get(f"{key}_reps"), b.get(f"{key}_reps")
    if ra and rb and len(ra) == len(rb):
        return statistics.median(x / y for x, y in zip(ra, rb))
    return a[key] / b[key]
