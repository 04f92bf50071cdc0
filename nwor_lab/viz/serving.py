"""Figures of `nwor-lab bench serve` results: the crossover of speculative decoding under load.

  serve_curves   per config, TPOT p50 (with its p90..p99 band) and output tokens/s against the
                 load: request rate (open loop) or clients (closed loop); a second result (e.g.
                 the stored GPU run beside a live CPU one) is a separate figure
  ratio_curves   EAGLE configs' TPOT p50 speedup and tokens/s ratio over target-only against the
                 load, one or more results side by side (e.g. 64- and 256-token outputs), with
                 target-only's 1× and an optional goal drawn in
  serve_table    the rows a chapter prints: per load point and config, TTFT / TPOT p50 / p90 /
                 p99 ms, tokens/s and the ratios against target-only
  crossover_points  where a config stops beating target-only, on TPOT and on tokens/s
  explain        the crossover from measured steps: decode vs EAGLE step at the batch, L, the
                 speedup they predict beside the one measured
"""
from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nwor_lab.viz.perf import _layout, result_subtitle


def steady_rows(result: Mapping) -> list:
    """The bench's rows under steady traffic: a `--phases` run also holds phase-switching rows at the
    same loads (`row["traffic"]`), which these figures must not mix in."""
    return [r for r in result["results"] if r.get("traffic", "steady") == "steady"]

_COLOURS = ["#9a9a9a", "#e69f00", "#56b4e9", "#cc79a7", "#009e73", "#d55e00", "#0072b2"]


def _load_key(row: Mapping):
    return row["rate"] if row["mode"] == "open" else row["concurrency"]


def serve_curves(result: Mapping, mode: str = "closed", title: str | None = None):
    """Two panels over the load of `mode` ("open": request rate, "closed": clients): TPOT p50 per
    config (p90 and p99 as a dotted line each) and output tokens/s."""
    rows = [r for r in steady_rows(result) if r["mode"] == mode]
    if not rows:
        raise ValueError(f"no {mode}-loop rows in this result: run bench serve with "
                         f"{'--rates' if mode == 'open' else '--concurrency'}")
    xlabel = "request rate (requests/s, Poisson)" if mode == "open" else "concurrent clients (closed loop)"
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TPOT (ms per output token, per request)",
                                                        "output tokens/s"), horizontal_spacing=0.12)
    configs = list(dict.fromkeys(r["config"] for r in rows))
    for i, name in enumerate(configs):
        series = sorted((r for r in rows if r["config"] == name), key=_load_key)
        x = [_load_key(r) for r in series]
        colour = _COLOURS[i % len(_COLOURS)]
        fig.add_trace(go.Scatter(x=x, y=[r["p50_tpot_ms"] for r in series], name=name, mode="lines+markers",
                                 line=dict(color=colour), legendgroup=name,
                                 hovertemplate=f"{name}<br>%{{x}}: TPOT p50 %{{y:.1f}} ms<extra></extra>"), row=1, col=1)
        for p, dash in (("p90", "dot"), ("p99", "dashdot")):
            fig.add_trace(go.Scatter(x=x, y=[r[f"{p}_tpot_ms"] for r in series], name=f"{name} {p}", mode="lines",
                                     line=dict(color=colour, dash=dash, width=1), legendgroup=name, showlegend=False,
                                     hovertemplate=f"{name}<br>%{{x}}: TPOT {p} %{{y:.1f}} ms<extra></extra>"),
                          row=1, col=1)
        fig.add_trace(go.Scatter(x=x, y=[r["output_throughput"] for r in series], name=name, mode="lines+markers",
                                 line=dict(color=colour), legendgroup=name, showlegend=False,
                                 hovertemplate=f"{name}<br>%{{x}}: %{{y:.0f}} tokens/s<extra></extra>"), row=1, col=2)
    wl = result["workload"]
    per = (f"at least {wl['requests']} requests per point, {wl['requests_per_client']} per client"
           if mode == "closed" and wl.get("requests_per_client") else f"{wl['requests']} requests per point")
    extra = f"{result['model']} · {per} · dotted: TPOT p90, dash-dot: p99"
    _layout(fig, title or f"Serving under load ({mode} loop)", result_subtitle(result, extra), height=460,
            legend_y=-0.28, bottom=130, subplot_titles=True)
    fig.update_xaxes(title_text=xlabel, type="log")
    fig.update_yaxes(rangemode="tozero")
    return fig


def ratio_curves(results: Mapping[str, Mapping], mode: str = "closed", *, goal: Mapping | None = None,
                 title: str | None = None):
    """Two panels over the load of `mode`: TPOT p50 speedup and output tokens/s ratio of every EAGLE
    config over target-only (the results' `crossover` rows), one colour per config and one dash per
    result (`results`: {label: result}, e.g. {"64-token outputs": r64, "256-token outputs": r256}).
    Above the grey line at 1 the config beats target-only. `goal`: {load: ratio} marks on the
    tokens/s panel."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("TPOT p50 speedup (target-only's TPOT / the config's)",
                                        "output tokens/s ratio (the config's / target-only's)"))
    dashes = ["solid", "dash", "dot", "dashdot"]
    rows_of = {label: [c for c in r.get("crossover", []) if c["mode"] == mode] for label, r in results.items()}
    configs = list(dict.fromkeys(c["config"] for rows in rows_of.values() for c in rows))
    if not configs:
        raise ValueError(f"no {mode}-loop crossover rows in these results: run bench serve with "
                         f"{'--rates' if mode == 'open' else '--concurrency'}")
    policies = {c.split()[-1] for c in configs}
    common = policies.pop() if len(policies) == 1 and next(iter(policies)).startswith("nwor=") else None
    short = {c: c.removesuffix(f" {common}") if common else c for c in configs}
    xs: set = set()
    for j, (label, rows) in enumerate(rows_of.items()):
        for name in dict.fromkeys(c["config"] for c in rows):
            colour = _COLOURS[1 + configs.index(name) % (len(_COLOURS) - 1)]
            series = sorted((c for c in rows if c["config"] == name), key=_load_key)
            x = [_load_key(c) for c in series]
            xs.update(x)
            legend = f"{short[name]}, {label}" if len(results) > 1 else short[name]
            for col, key in ((1, "tpot_p50_speedup"), (2, "output_throughput_ratio")):
                fig.add_trace(go.Scatter(x=x, y=[c[key] for c in series], name=legend, mode="lines+markers",
                                         line=dict(color=colour, dash=dashes[j % len(dashes)], width=2.5),
                                         marker=dict(size=8), legendgroup=legend, showlegend=col == 1,
                                         hovertemplate=f"{legend}<br>%{{x}}: %{{y:.2f}}×<extra></extra>"),
                              row=1, col=col)
    ticks = sorted(xs)
    for col in (1, 2):
        fig.add_trace(go.Scatter(x=[ticks[0], ticks[-1]], y=[1, 1], mode="lines", name="target-only (ratio 1)",
                                 line=dict(color=_COLOURS[0], width=2), showlegend=col == 1,
                                 legendgroup="target-only", hoverinfo="skip"), row=1, col=col)
    if goal:
        fig.add_trace(go.Scatter(x=list(goal), y=list(goal.values()), mode="markers+text", name="goal",
                                 text=[f"goal {v:g}×" for v in goal.values()], textposition="top center",
                                 textfont=dict(color="#b2182b", size=12),
                                 marker=dict(symbol="line-ew-open", size=34, color="#b2182b",
                                             line=dict(width=3, color="#b2182b")),
                                 hovertemplate="goal at %{x}: %{y:.2f}×<extra></extra>"), row=1, col=2)
    xlabel = "request rate (requests/s, Poisson arrivals)" if mode == "open" else "concurrent clients (closed loop)"
    first = next(iter(results.values()))
    extra = " · ".join([f"model {first['model']}", *([f"write policy {common.removeprefix('nwor=')}"] if common else []),
                        *([f"{dashes[j]}: {label}" for j, label in enumerate(results)] if len(results) > 1 else [])])
    entries = len(configs) * len(results) + 1 + bool(goal)
    _layout(fig, title or f"EAGLE over target-only ({mode} loop)", result_subtitle(first, extra), height=470,
            legend_y=0.0, bottom=105 if entries <= 4 else 135, subplot_titles=True)
    fig.update_xaxes(title_text=xlabel, type="log", tickvals=ticks, ticktext=[f"{t:g}" for t in ticks])
    fig.update_yaxes(rangemode="tozero", ticksuffix="×")
    return fig


def serve_table(result: Mapping) -> list[dict]:
    """One row per (load point, config): TTFT and TPOT p50 / p90 / p99 ms, output tokens/s, the
    accept length, the mean batch, and TPOT / throughput against target-only at that load."""
    base = {(r["mode"], _load_key(r)): r for r in steady_rows(result) if r["config"] == "target-only"}
    out = []
    for r in steady_rows(result):
        b = base.get((r["mode"], _load_key(r)))
        c = _load_key(r)
        row = {"load": f"{c:g} req/s" if r["mode"] == "open" else f"{c} client{'s' if c != 1 else ''}",
               "config": r["config"], **{f"{m}_{p}": r[f"{p}_{m}_ms"] for m in ("ttft", "tpot") for p in ("p50", "p90", "p99")},
               "tok_s": r["output_throughput"], "accept_length": r.get("accept_length"),
               "mean_batch": r["occupancy"]["mean_batch"]}
        if b is not None and b is not r:
            row["tpot_speedup"] = round(b["p50_tpot_ms"] / r["p50_tpot_ms"], 3) if r["p50_tpot_ms"] else None
            row["throughput_ratio"] = round(r["output_throughput"] / max(b["output_throughput"], 1e-9), 3)
        out.append(row)
    return out


def crossover_points(result: Mapping, config: str) -> dict:
    """Per loop mode, the first load (ascending) where `config` stops beating target-only: on TPOT
    p50 (`tpot`) and on output tokens/s (`throughput`); None where it never stops (in the range run)."""
    rows = [r for r in serve_table(result) if r["config"] == config and "tpot_speedup" in r]
    out = {}
    for mode, unit in (("open", " req/s"), ("closed", " client")):
        pts = sorted((r for r in rows if unit in r["load"]), key=lambda r: float(r["load"].split()[0]))
        out[mode] = {m: next((r["load"] for r in pts if r[key] is not None and r[key] < 1.0), None)
                     for m, key in (("tpot", "tpot_speedup"), ("throughput", "throughput_ratio"))}
    return out


def explain(result: Mapping, config: str) -> list[dict]:
    """Per closed-loop load point: the batch the engine mostly ran (the decode steps' most frequent
    size), a target-only decode step and a `config` step at that batch (measured in the runs, ms),
    the accept length L, the speedup they predict (L x decode / step) and the TPOT speedup measured."""
    def by_n(row, drafting: bool):
        steps = [s for s in row["steps_by_batch"] if (s["drafts"] > 0) == drafting]
        return {s["requests"]: s for s in steps}
    base = {r["concurrency"]: r for r in steady_rows(result) if r["mode"] == "closed" and r["config"] == "target-only"}
    out = []
    for r in steady_rows(result):
        b = base.get(r.get("concurrency"))
        if r["mode"] != "closed" or r["config"] != config or b is None:
            continue
        mine, theirs = by_n(r, True), by_n(b, False)
        common = [n for n in mine if n in theirs]
        if not common:
            continue
        n = max(common, key=lambda n: mine[n]["steps"])
        decode, step = theirs[n]["mean_ms"], mine[n]["mean_ms"]
        per_request = mine[n]["tokens_per_step"] / n          # L over this batch's steps
        row = {"clients": r["concurrency"], "batch": n, "decode_ms": decode, "eagle_step_ms": step,
               "step_ratio": round(step / decode, 3), "tokens_per_request_step": round(per_request, 3),
               "predicted_speedup": round(per_request * decode / step, 3),
               "measured_tpot_speedup": round(b["p50_tpot_ms"] / r["p50_tpot_ms"], 3)}
        row.update(_components_at(result, config, n))
        out.append(row)
    return out


def _components_at(result: Mapping, config: str, batch: int) -> dict:
    """The parts timed alone (`bench serve --components`, 8B shape) at this batch, for an EAGLE
    config named `HEAD k=K ...`: the napkin step (a verify of 1 + K tokens + K head passes) and
    what the measured step spends beyond it (sampler, commit, host, launch gaps)."""
    comps = {c["batch"]: c for c in result.get("components", [])}
    parts = config.split()
    c = comps.get(batch)
    if c is None or len(parts) < 2 or not parts[1].startswith("k="):
        return {}
    head, k = parts[0], parts[1][2:]
    if not k.isdigit():                     # k=auto: the components were timed at k_max
        timed = [int(key[len("verify_k"):-len("_ms")]) for key in c if key.startswith("verify_k")]
        if not timed:
            return {}
        k = str(max(timed))
    k = int(k)
    verify, head_ms = c.get(f"verify_k{k}_ms"), c.get(f"{head}_pass_ms")
    if verify is None or head_ms is None:
        return {}
    return {"component_decode_ms": c["decode_ms"], "component_verify_ms": verify, "component_head_pass_ms": head_ms,
            "napkin_step_ms": round(verify + k * head_ms, 3)}
