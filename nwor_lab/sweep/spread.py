"""Timings with their noise: a measurement repeated in one run, recorded as its median and range,
and what a report may (and may not) conclude from it.

A chapter times `repeats` runs and records one family of three flat metrics::

    record_metrics({**spread("tok_s", [412.0, 388.5, 401.2])})
    # -> {"tok_s": 401.2, "tok_s_min": 388.5, "tok_s_max": 412.0}

`name` holds the median (so a reader of the plain key, as the workshop notes, gets the typical
value) and `name_min` / `name_max` the range of the repeats. The report draws a family as the
median with a min-max error bar, never as a bar from zero, and says in words where the configs it
compares lie within one another's range (`verdicts`): then the figure shows no ranking.

The range of one run's repeats is the noise inside one process. Separate runs are separate
processes on a machine whose load changes between them, so a difference between runs can exceed
every run's own range and still be noise; a verdict says so rather than call it a ranking.

Pure Python: no plotly, no numpy.
"""
from __future__ import annotations

import math
import statistics
from typing import Any

LOW, HIGH = "_min", "_max"
TIME_UNITS = ("s", "ms", "µs", "ns", "tokens/s")   # what `nwor_lab.sweep.figures.metric_label` names


def spread(name: str, values: list[float]) -> dict[str, float]:
    """`{name: median, name_min: min, name_max: max}` of repeated measurements (at least one)."""
    values = [float(v) for v in values]
    if not values or not all(math.isfinite(v) for v in values):
        raise ValueError(f"spread({name!r}): give at least one finite measurement, got {values}")
    return {name: statistics.median(values), name + LOW: min(values), name + HIGH: max(values)}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def families(rows: list[dict]) -> list[str]:
    """Metric names recorded with their range (`name`, `name_min`, `name_max` all numbers) in
    every ok run that records `name`; first-seen order."""
    ok = [(r.get("metrics") or {}) for r in rows if r.get("status") == "ok"]
    names = dict.fromkeys(k for m in ok for k in m if not k.endswith((LOW, HIGH)))
    return [n for n in names
            if any(n in m for m in ok)
            and all(_number(m.get(n)) and _number(m.get(n + LOW)) and _number(m.get(n + HIGH)) for m in ok if n in m)]


def members(family: str) -> tuple[str, str]:
    return family + LOW, family + HIGH


def is_timing(name: str, unit: str | None, spread_names: list[str]) -> bool:
    """A metric measured with a clock: recorded with a range, or in a unit of time or rate."""
    return name in spread_names or unit in TIME_UNITS


def _fmt(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"


def verdicts(rows: list[dict], metric: str, params: list[str], unit: str | None, *, has_range: bool) -> list[str]:
    """One sentence per group of compared configs: the values of the first varying parameter
    (the figure's x axis) at each combination of the others. Says whether their differences lie
    within the repeats' ranges, or, for a metric recorded once per run, that no range was measured."""
    ok = [r for r in rows if r.get("status") == "ok" and _number((r.get("metrics") or {}).get(metric))]
    if not ok:
        return []
    x_name, others = (params[0], params[1:]) if params else (None, [])
    groups: dict[str, list[dict]] = {}
    for r in ok:
        key = ", ".join(f"{n}={r['params'].get(n)}" for n in others)
        groups.setdefault(key, []).append(r)
    what = f"{metric}" + (f" ({unit})" if unit else "")
    out = []
    for key, group in groups.items():
        where = f"At {key}: " if key else ""
        names = [f"{x_name}={r['params'].get(x_name)}" if x_name else r["run_id"] for r in group]
        med = [r["metrics"][metric] for r in group]
        if len(group) < 2:
            continue
        lo_med, hi_med = min(med), max(med)
        diff = (hi_med - lo_med) / lo_med if lo_med > 0 else math.inf
        if not has_range:
            out.append(f"{where}{what} was measured once per run ({_fmt(lo_med)} to {_fmt(hi_med)}), with no "
                       f"repeats: its noise is unknown, so these {len(group)} values rank nothing.")
            continue
        low = [r["metrics"][metric + LOW] for r in group]
        high = [r["metrics"][metric + HIGH] for r in group]
        apart = [(names[i], names[j]) for i in range(len(group)) for j in range(i + 1, len(group))
                 if high[i] < low[j] or high[j] < low[i]]
        pooled = f"pooled range {_fmt(min(low))} to {_fmt(max(high))}"
        if not apart:
            out.append(f"{where}the medians of {', '.join(names)} differ by {diff:.0%} at most, and every run's "
                       f"min-max range overlaps every other's ({pooled}): the differences lie within the noise "
                       f"of the repeats; read no ranking from this figure.")
        else:
            pairs = "; ".join(f"{a} and {b}" for a, b in apart)
            out.append(f"{where}the ranges of {pairs} do not overlap (medians {_fmt(lo_med)} to {_fmt(hi_med)}, "
                       f"{pooled}). The repeats share one process and the runs do not, so the machine's load "
                       f"can differ between runs by more than any run's range: repeat the sweep before reading "
                       f"this as a ranking.")
    return out
