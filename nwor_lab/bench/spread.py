"""A measurement's repeats in one form: every value in run order, their median and min–max (what a
bench stores per point, and what a ratio of two configs' paired repeats becomes)."""
from __future__ import annotations

import statistics
from collections.abc import Sequence


def spread(values: Sequence[float], digits: int | None = None) -> dict:
    """{median, min, max, reps} of `values` (in run order), each rounded to `digits` when given."""
    vals = list(values)
    r = (lambda x: x) if digits is None else (lambda x: round(x, digits))
    return {"median": r(statistics.median(vals)), "min": r(min(vals)), "max": r(max(vals)),
            "reps": [r(x) for x in vals]}


def put_spread(row: dict, key: str, values: Sequence[float]) -> None:
    """`row[key]` the median of `values`, and `<key>_min`, `<key>_max`, `<key>_reps` beside it."""
    s = spread(values)
    row[key], row[key + "_min"], row[key + "_max"], row[key + "_reps"] = s["median"], s["min"], s["max"], s["reps"]


def paired(mine: Sequence[float], other: Sequence[float], digits: int | None = None) -> dict:
    """`spread` of the repeat-by-repeat ratios mine[i] / other[i] (repeat i of both run next to each
    other: a ratio cancels what drifts between repeats)."""
    return spread([a / max(b, 1e-9) for a, b in zip(mine, other)], digits)
