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
every run's own range and still be noise. A chapter that times the same work in every run (10_sweep:
target-only decoding) names it, `record_metrics({"timing_reference": "target_only_tok_s"})`; how far
that reference moved between runs is the noise between processes, and a difference no larger than
it ranks nothing either. A ratio taken inside each run (a speed-up against the reference timed
next to it) cancels most of that drift.

Pure Python: no plotly, no numpy.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

LOW, HIGH = "_min", "_max"
REFERENCE = "timing_reference"   # a text metric: the family that times the same work in every run
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


def reference_of(rows: list[dict]) -> str | None:
    """The timing every ok run declares (`REFERENCE`) as the same work measured in every run, when
    they agree on one that is recorded with its range; else None."""
    named = {(r.get("metrics") or {}).get(REFERENCE) for r in rows if r.get("status") == "ok"}
    if len(named) != 1:
        return None
    name = named.pop()
    return name if isinstance(name, str) and name in families(rows) else None


@dataclass(frozen=True)
class Verdict:
    """What one group of compared configs shows: `within` the noise (no ranking) or not."""

    text: str
    within: bool


def verdicts(rows: list[dict], metric: str, params: list[str], unit: str | None, *, has_range: bool,
             reference: str | None = None) -> list[Verdict]:
    """One verdict per group of compared configs: the values of the first varying parameter (the
    figure's x axis) at each combination of the others.

    The differences lie within the noise when every run's min-max range overlaps every other's
    (the noise inside one process), or when the medians differ by no more than `reference`, the
    same work timed in every run, differed between these runs (the noise between processes). A
    metric recorded once per run has no measured noise, and ranks nothing either.
    """
    ok = [r for r in rows if r.get("status") == "ok" and _number((r.get("metrics") or {}).get(metric))]
    x_name, others = (params[0], params[1:]) if params else (None, [])
    groups: dict[str, list[dict]] = {}
    for r in ok:
        groups.setdefault(", ".join(f"{n}={r['params'].get(n)}" for n in others), []).append(r)
    out = []
    for key, group in groups.items():
        if len(group) < 2:
            continue
        where = f"At {key}: " if key else ""
        names = [f"{x_name}={r['params'].get(x_name)}" if x_name else r["run_id"] for r in group]
        med = [r["metrics"][metric] for r in group]
        lo_med, hi_med = min(med), max(med)
        factor = hi_med / lo_med if lo_med > 0 else math.inf
        medians = f"medians {_fmt(lo_med)} to {_fmt(hi_med)}" + (f" {unit}" if unit else "")
        if not has_range:
            out.append(Verdict(f"{where}measured once per run ({medians[8:]}), without repeats: its noise is "
                               f"unknown, so these {len(group)} values rank nothing.", True))
            continue
        low = [r["metrics"][metric + LOW] for r in group]
        high = [r["metrics"][metric + HIGH] for r in group]
        apart = [f"{names[i]} and {names[j]}" for i in range(len(group)) for j in range(i + 1, len(group))
                 if high[i] < low[j] or high[j] < low[i]]
        pairs = ("no two runs' ranges overlap" if len(apart) == len(group) * (len(group) - 1) // 2 else
                 f"the ranges of {'; '.join(apart)} do not overlap")
        ref = [r["metrics"].get(reference) for r in group] if reference else []
        ref_factor = (max(ref) / min(ref)) if ref and all(_number(v) and v > 0 for v in ref) else None
        drift = (f"{reference}, the same work in every run, moved {ref_factor:.2f}x between these runs "
                 f"(the machine's load changed between them)" if ref_factor else "")
        if metric == reference:
            out.append(Verdict(f"{where}{medians}: this is the same work in every run, so its {factor:.2f}x "
                               f"between runs is pure noise, the machine's load changing between processes; a "
                               f"timing that differs between these runs by no more than that ranks nothing.", True))
        elif not apart:
            out.append(Verdict(f"{where}{medians}, {factor:.2f}x at most apart, and every run's min-max range "
                               f"overlaps every other's: the differences lie within the noise of the repeats; "
                               f"read no ranking from this figure.", True))
        elif ref_factor and factor <= ref_factor:
            out.append(Verdict(f"{where}{medians}, {factor:.2f}x apart; {pairs}, but {drift}: the differences "
                               f"lie within that noise; read no ranking from this figure.", True))
        else:
            beyond = f"; {drift}, less than this" if ref_factor else ""
            out.append(Verdict(f"{where}{medians}, {factor:.2f}x apart: {pairs}{beyond}. Repeats share one "
                               f"process and runs do not: repeat the sweep (another --out) before reading this "
                               f"as a ranking.", False))
    return out
