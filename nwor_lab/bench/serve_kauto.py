"""`--k auto`'s verdicts in a `bench serve` result: is the adaptive count worth running?

Per load point (and traffic: `steady`, or `phases` when the forced acceptance changes mid-run,
`nwor_lab.serve.phases`) and per adaptive config (`HEAD k=auto nwor=M`), its output tokens/s against

    target-only      the same point's target-only row
    the best fixed k the fixed-k config of the same head and write policy with the highest median
                     output tokens/s at that point (chosen after the fact: an operator's best guess
                     could only be worse)

each ratio paired repeat by repeat (repeat i of auto over repeat i of the other, run next to each
other in the bench's ABBA order), with every repeat's ratio, their median and min-max. The rules
(issue 39's "done when"): median ratio >= 1 over target-only at every point, >= 0.97 over the best
fixed k at every point, and >= 1.10 over the best fixed k at every phase-switching point. A rule
with no point to judge (no fixed-k config run, no phase point) is reported as not judged, not as met.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from nwor_lab.bench.spread import paired as paired_ratios

RULES = {"over_target_only": 1.0, "over_best_fixed": 0.97, "over_best_fixed_phases": 1.10}


def _point(row: Mapping) -> tuple:
    return row["mode"], row.get("rate"), row.get("concurrency"), row.get("traffic", "steady")


def _parts(config: str) -> tuple[str, str, str] | None:
    """`eagle3 k=4 nwor=stage` -> ("eagle3", "4", "nwor=stage"); None for target-only."""
    parts = config.split()
    if len(parts) < 3 or not parts[1].startswith("k="):
        return None
    return parts[0], parts[1][2:], " ".join(parts[2:])


def _reps(row: Mapping) -> list[float]:
    return list(row.get("output_throughput_reps", [row["output_throughput"]]))


def paired(mine: Mapping, other: Mapping) -> dict:
    """Repeat-by-repeat output tokens/s ratios of `mine` over `other` -> reps, median, min, max."""
    return paired_ratios(_reps(mine), _reps(other), 4)


def verdicts(rows: Sequence[Mapping], rules: Mapping[str, float] = RULES) -> dict:
    """`bench serve` result rows -> {"rules", "points": [per point and auto config], "met": {rule: bool or
    None (not judged)}, "all_met"}. Each point: its load, traffic, auto's tokens/s (median, min-max,
    reps), target-only's, the best fixed k's name and tokens/s, the paired ratios and each rule's verdict."""
    by_point: dict[tuple, list[Mapping]] = {}
    for r in rows:
        by_point.setdefault(_point(r), []).append(r)
    points = []
    for key, group in by_point.items():
        base = next((r for r in group if r["config"] == "target-only"), None)
        for auto in (r for r in group if (_parts(r["config"]) or ("", "", ""))[1] == "auto"):
            head, _, policy = _parts(auto["config"])
            fixed = [r for r in group if (p := _parts(r["config"])) and p[0] == head and p[2] == policy
                     and p[1].isdigit()]
            best = max(fixed, key=lambda r: r["output_throughput"], default=None)
            out = {"config": auto["config"], "mode": key[0], "rate": key[1], "concurrency": key[2], "traffic": key[3],
                   "auto_tok_s": _spread(auto), "target_tok_s": _spread(base) if base else None,
                   "best_fixed": best["config"] if best else None, "best_fixed_tok_s": _spread(best) if best else None,
                   "fixed_tok_s": {r["config"]: r["output_throughput"] for r in fixed}}
            out["over_target_only"] = paired(auto, base) if base else None
            out["over_best_fixed"] = paired(auto, best) if best else None
            out["verdicts"] = {
                "over_target_only": _meets(out["over_target_only"], rules["over_target_only"]),
                "over_best_fixed": _meets(out["over_best_fixed"], rules["over_best_fixed"]),
                "over_best_fixed_phases": _meets(out["over_best_fixed"], rules["over_best_fixed_phases"])
                if key[3] == "phases" else None}
            points.append(out)
    met = {}
    for rule in rules:
        judged = [p["verdicts"][rule] for p in points if p["verdicts"][rule] is not None]
        met[rule] = all(judged) if judged else None
    return {"rules": {name: f"median paired output tokens/s ratio >= {v}" + (" at every phase-switching point"
                                                                           if name.endswith("phases") else
                                                                           " at every point")
                      for name, v in rules.items()},
            "points": points, "met": met, "all_met": all(v is True for v in met.values())}


def _spread(row: Mapping) -> dict:
    reps = _reps(row)
    return {"median": row["output_throughput"], "min": min(reps), "max": max(reps), "reps": reps}


def _meets(ratio: Mapping | None, bound: float) -> bool | None:
    return None if ratio is None else ratio["median"] >= bound
