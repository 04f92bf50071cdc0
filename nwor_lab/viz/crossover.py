"""Readings of stored `nwor-lab bench serve` results: EAGLE against target-only under load.

  ratios        per load point, a config's TPOT p50 speedup and output tokens/s ratio over
                target-only (the result's `crossover` rows)
  step_budget   at one closed-loop concurrency: the napkin from the components timed alone, the
                measured steps at that batch, end to end, and where each run's wall time went
  adaptive_points  per load point, `--k auto`'s ratios and the draft counts of its decode steps
  percentiles   TTFT / TPOT p50 / p90 / p99 per load point and config, as a Markdown table
  markdown_table   rows -> a Markdown table a chapter displays (viz/tables.py, imported here)

Everything here is read from the JSON; nothing is measured. Shapes: a result is the dict
`bench serve --out` writes (`results`, `crossover`, `components`).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from nwor_lab.viz.serving import _components_at, serve_table, steady_rows
from nwor_lab.viz.tables import markdown_table


def load_label(row: Mapping) -> str:
    """`8 req/s` (open loop) or `8 clients` (closed loop)."""
    if row["mode"] == "open":
        return f"{row['rate']:g} req/s"
    c = row["concurrency"]
    return f"{c} client" + ("s" if c != 1 else "")


def ratios(result: Mapping, config: str, mode: str | None = None) -> list[dict]:
    """Per load point of `config` (ascending load; `mode` "open" / "closed" / None for both):
    {mode, load (rate or clients), label, tpot (TPOT p50 speedup), throughput (tokens/s ratio)}."""
    rows = [c for c in result.get("crossover", []) if c["config"] == config and (mode is None or c["mode"] == mode)]
    if not rows:
        raise ValueError(f"config {config!r} has no crossover rows{f' in {mode} loop' if mode else ''}; the result "
                         f"holds {sorted({c['config'] for c in result.get('crossover', [])})}")
    out = [{"mode": c["mode"], "load": c["rate"] if c["mode"] == "open" else c["concurrency"], "label": load_label(c),
            "tpot": c["tpot_p50_speedup"], "throughput": c["output_throughput_ratio"]} for c in rows]
    return sorted(out, key=lambda r: (r["mode"] != "open", r["load"]))


def _closed(result: Mapping, config: str, clients: int) -> Mapping:
    for r in steady_rows(result):
        if r["mode"] == "closed" and r["concurrency"] == clients and r["config"] == config:
            return r
    raise ValueError(f"no closed-loop row of {config!r} at {clients} clients: run bench serve with "
                     f"--concurrency {clients}")


def _time_split(row: Mapping, clients: int) -> dict:
    """Seconds of the run in decode steps of a full batch, in decode steps of fewer requests (ramp,
    drain), and the rest (steps that carry a prefill, idle)."""
    full = sum(s["steps"] * s["mean_ms"] for s in row["steps_by_batch"] if s["requests"] == clients) / 1e3
    part = sum(s["steps"] * s["mean_ms"] for s in row["steps_by_batch"] if s["requests"] != clients) / 1e3
    return {"duration_s": row["duration_s"], "full_batch_s": round(full, 4), "partial_batch_s": round(part, 4),
            "rest_s": round(row["duration_s"] - full - part, 4)}


def step_budget(result: Mapping, config: str, clients: int) -> dict:
    """EAGLE `config` against target-only at `clients` (closed loop), step by step:

    napkin      L x decode / (verify of 1 + k + k head passes), the parts timed alone at that batch
                (`components`) and L the run's measured accept length
    per step    (tokens / mean ms) of the config's decode steps with `clients` requests and k drafts,
                over target-only's with `clients` requests (`steps_by_batch`)
    end to end  output tokens/s over target-only's
    time        each run's wall time split into full-batch decode steps, decode steps with fewer
                requests, and the rest (steps carrying a prefill, idle)"""
    target, eagle = _closed(result, "target-only", clients), _closed(result, config, clients)
    comp = _components_at(result, config, clients)
    if not comp:
        raise ValueError(f"no components timed at batch {clients} for {config!r}: run bench serve --model 8b "
                         f"--components {clients}")
    k = max(s["drafts"] for s in eagle["steps_by_batch"])
    t_step = next((s for s in target["steps_by_batch"] if s["requests"] == clients and s["drafts"] == 0), None)
    e_step = next((s for s in eagle["steps_by_batch"] if s["requests"] == clients and s["drafts"] == k), None)
    if t_step is None or e_step is None:
        raise ValueError(f"{clients} clients: no decode step with {clients} requests in both runs")
    L = eagle["accept_length"]
    napkin = L * comp["component_decode_ms"] / comp["napkin_step_ms"]
    step_speedup = (e_step["tokens_per_step"] / e_step["mean_ms"]) / (t_step["tokens_per_step"] / t_step["mean_ms"])
    return {"clients": clients, "k": k, "accept_length": L, **comp, "napkin_speedup": round(napkin, 3),
            "target_step_ms": t_step["mean_ms"], "eagle_step_ms": e_step["mean_ms"],
            "target_tokens_per_step": t_step["tokens_per_step"], "eagle_tokens_per_step": e_step["tokens_per_step"],
            "target_steps": t_step["steps"], "eagle_steps": e_step["steps"],
            "target_outside_components_ms": round(t_step["mean_ms"] - comp["component_decode_ms"], 3),
            "eagle_outside_components_ms": round(e_step["mean_ms"] - comp["napkin_step_ms"], 3),
            "step_speedup": round(step_speedup, 3),
            "target_tok_s": target["output_throughput"], "eagle_tok_s": eagle["output_throughput"],
            "end_to_end": round(eagle["output_throughput"] / target["output_throughput"], 3),
            "target_time": _time_split(target, clients), "eagle_time": _time_split(eagle, clients)}


def adaptive_points(result: Mapping, config: str, fixed: str | None = None) -> list[dict]:
    """Per load point of an adaptive config (`HEAD k=auto`): its ratios over target-only (and
    `fixed`'s, a fixed-k config, as `fixed_tpot` / `fixed_throughput`) and, from this point's decode
    steps (`steps_by_batch`), how many ran at each draft count and their mean ms.
    (The row's `k_auto.chosen` counts every decision since the warm-up: the controller keeps what it
    learned across load points, so it is cumulative, not this point's.)"""
    by_load = {(r["mode"], r["load"]): r for r in ratios(result, config)}
    other = {(r["mode"], r["load"]): r for r in ratios(result, fixed)} if fixed else {}
    out = []
    for row in steady_rows(result):
        if row["config"] != config:
            continue
        load = row["rate"] if row["mode"] == "open" else row["concurrency"]
        counts: dict[int, list[float]] = {}
        for s in row["steps_by_batch"]:
            c = counts.setdefault(s["drafts"], [0, 0.0])
            c[0] += s["steps"]
            c[1] += s["steps"] * s["mean_ms"]
        steps = {d: {"steps": n, "mean_ms": round(ms / n, 3)} for d, (n, ms) in sorted(counts.items())}
        f = other.get((row["mode"], load), {})
        out.append({**by_load[row["mode"], load], "fixed_tpot": f.get("tpot"), "fixed_throughput": f.get("throughput"),
                    "steps_by_drafts": steps, "chosen_so_far": row["k_auto"]["chosen"],
                    "explored_so_far": row["k_auto"]["explored"]})
    return sorted(out, key=lambda r: (r["mode"] != "open", r["load"]))


def percentiles(result: Mapping) -> str:
    """TTFT and TPOT p50 / p90 / p99 (ms), output tokens/s, accept length L and mean batch per load
    point and config, with TPOT and tokens/s over target-only's, as a Markdown table."""
    def num(v, f):
        return "–" if v is None else format(v, f)
    rows = []
    for r in serve_table(result):
        rows.append([r["load"], r["config"], " / ".join(num(r[f"ttft_{p}"], ".0f") for p in ("p50", "p90", "p99")),
                     " / ".join(num(r[f"tpot_{p}"], ".2f") for p in ("p50", "p90", "p99")), num(r["tok_s"], ",.0f"),
                     num(r["accept_length"], ".2f"), num(r["mean_batch"], ".1f"),
                     num(r.get("tpot_speedup"), ".2f") + ("×" if r.get("tpot_speedup") else ""),
                     num(r.get("throughput_ratio"), ".2f") + ("×" if r.get("throughput_ratio") else "")])
    return markdown_table(["load", "config", "TTFT p50 / p90 / p99 ms", "TPOT p50 / p90 / p99 ms", "tokens/s",
                           "L", "mean batch", "TPOT speedup", "tokens/s ratio"], rows)


def side_by_side(results: Mapping[str, Mapping], config: str, goal: Mapping[int, float] | None = None) -> list[dict]:
    """Closed loop, `config`'s tokens/s ratio over target-only per clients in each result
    ({label: result}), and whether each meets `goal` ({clients: ratio}) where one is set:
    [{clients, ratios: {label: ratio or None}, goal, met: {label: bool}}]."""
    by = {label: {p["load"]: p["throughput"] for p in ratios(r, config, "closed")} for label, r in results.items()}
    out = []
    for c in sorted({c for d in by.values() for c in d}):
        row = {"clients": c, "ratios": {label: d.get(c) for label, d in by.items()}, "goal": (goal or {}).get(c)}
        row["met"] = {label: v is not None and v >= row["goal"] for label, v in row["ratios"].items()} \
            if row["goal"] is not None else {}
        out.append(row)
    return out


def adaptive_summary(results: Mapping[str, Mapping], config: str, fixed: str | None = None) -> dict:
    """`config` (`HEAD k=auto`) over every load point of every result ({label: result}):
    points [(label, point)] (`adaptive_points`), the lowest TPOT speedup and tokens/s ratio
    (label, point), decode steps per draft count summed over the points, the point where it trails
    `fixed` most on tokens/s (label, point), and each result's final cumulative `chosen` and
    `explored` counts."""
    points = [(label, p) for label, r in results.items() for p in adaptive_points(r, config, fixed)]
    if not points:
        raise ValueError(f"no load point of {config!r} in these results")
    steps: dict[int, int] = {}
    for _, p in points:
        for d, s in p["steps_by_drafts"].items():
            steps[d] = steps.get(d, 0) + s["steps"]
    behind = [lp for lp in points if lp[1]["fixed_throughput"]]
    last = {label: [p for lbl, p in points if lbl == label][-1] for label in results}
    return {"points": points, "lowest_tpot": min(points, key=lambda lp: lp[1]["tpot"]),
            "lowest_throughput": min(points, key=lambda lp: lp[1]["throughput"]),
            "above_everywhere": all(p["tpot"] > 1 and p["throughput"] > 1 for _, p in points),
            "steps_by_drafts": dict(sorted(steps.items())),
            "most_behind": min(behind, key=lambda lp: lp[1]["throughput"] / lp[1]["fixed_throughput"]) if behind else None,
            "chosen": {label: (p["chosen_so_far"], p["explored_so_far"]) for label, p in last.items()}}


def verdicts(results: Mapping[str, Mapping]) -> list[dict]:
    """Per result ({label: result}), EAGLE config and loop mode: the measured range (first and last
    load's labels), the first load where TPOT p50 / tokens/s falls below target-only's (None:
    never, in the range) and the lowest ratio of each."""
    out = []
    for label, r in results.items():
        for config in dict.fromkeys(x["config"] for x in r.get("crossover", [])):
            pts = ratios(r, config)
            for mode in dict.fromkeys(p["mode"] for p in pts):
                mine = [p for p in pts if p["mode"] == mode]
                out.append({"result": label, "config": config, "mode": mode, "first": mine[0]["label"],
                            "last": mine[-1]["label"],
                            "tpot_below_from": next((p["label"] for p in mine if p["tpot"] < 1), None),
                            "throughput_below_from": next((p["label"] for p in mine if p["throughput"] < 1), None),
                            "lowest_tpot": min(p["tpot"] for p in mine),
                            "lowest_throughput": min(p["throughput"] for p in mine)})
    return out


def sign_over_load(points: Sequence[Mapping], key: str) -> str:
    """Where `key` ("tpot" / "throughput") of `ratios` points (ascending load) stands against
    target-only's 1: "above at every load measured", "below at every load measured", "above up to
    X, below from Y" (a crossover inside the range) or "mixed" (it crosses more than once: noise)."""
    above = [p[key] >= 1 for p in points]
    if all(above):
        return "above at every load measured"
    if not any(above):
        return "below at every load measured"
    k = above.index(False)
    if all(above[:k]) and not any(above[k:]):
        return f"above up to {points[k - 1]['label']}, below from {points[k]['label']}"
    return "mixed: " + ", ".join(f"{p['label']} {p[key]:.2f}×" for p in points)
