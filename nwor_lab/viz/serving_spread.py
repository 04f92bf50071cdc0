"""`bench serve` results with their spread: temperatures side by side, and `--k auto`'s verdicts.

  spread_curves   one panel per result ({label: result}, e.g. {"T = 0": r0, "T = 0.8": r08}), each
                  EAGLE config's output tokens/s ratio over target-only against the load (the
                  `crossover` rows: the median of the per-repeat ratios), with each point's min-max
                  over the repeats as an error bar, target-only's 1x and an optional goal
  spread_table    the same points as a Markdown table: tokens/s median [min-max] of each config and
                  the ratio median [min-max] with every repeat's value
  kauto_table     `--k auto`'s verdicts (`bench serve`'s `kauto`: over target-only and the best fixed k,
                  per point, steady and phase-switching traffic) as a Markdown table

Everything is read from the JSON; nothing is measured. A result without repeats (written before
`--repeats`) has no min-max: its points are drawn without bars and the table says "1 run".
"""
from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nwor_lab.viz.perf import _layout, result_subtitle
from nwor_lab.viz.tables import markdown_table, spread_text as _spread

_COLOURS = ["#e69f00", "#56b4e9", "#cc79a7", "#009e73", "#d55e00", "#0072b2"]


def _load(row: Mapping):
    return row["rate"] if row["mode"] == "open" else row["concurrency"]


def _label(row: Mapping) -> str:
    if row["mode"] == "open":
        return f"{row['rate']:g} req/s"
    return f"{row['concurrency']} client" + ("s" if row["concurrency"] != 1 else "")


def _rows(result: Mapping, mode: str) -> list[Mapping]:
    return [c for c in result.get("crossover", []) if c["mode"] == mode and c.get("traffic", "steady") == "steady"]


def spread_curves(results: Mapping[str, Mapping], mode: str = "closed", *, goal: Mapping | None = None,
                  title: str | None = None):
    """One panel per result, side by side: output tokens/s over target-only per EAGLE config against the
    load of `mode`, the median of the paired repeats with their min-max as error bars."""
    if not results:
        raise ValueError("spread_curves: no result given (each stored file absent?): nothing to draw")
    labels = list(results)
    fig = make_subplots(rows=1, cols=len(labels), shared_yaxes=True, horizontal_spacing=0.06,
                        subplot_titles=[f"{label}: tokens/s over target-only" for label in labels])
    configs = list(dict.fromkeys(c["config"] for r in results.values() for c in _rows(r, mode)))
    if not configs:
        raise ValueError(f"no {mode}-loop crossover rows in these results: run bench serve with "
                         f"{'--rates' if mode == 'open' else '--concurrency'}")
    ticks: set = set()
    for col, label in enumerate(labels, start=1):
        rows = _rows(results[label], mode)
        for name in configs:
            series = sorted((c for c in rows if c["config"] == name), key=_load)
            if not series:
                continue
            x = [_load(c) for c in series]
            ticks.update(x)
            y = [c["output_throughput_ratio"] for c in series]
            bars = all("output_throughput_ratio_min" in c for c in series)
            err = dict(type="data", symmetric=False, thickness=1.5, width=6,
                       array=[c["output_throughput_ratio_max"] - c["output_throughput_ratio"] for c in series],
                       arrayminus=[c["output_throughput_ratio"] - c["output_throughput_ratio_min"] for c in series]) \
                if bars else None
            reps = [", ".join(f"{v:.2f}" for v in c.get("output_throughput_ratio_reps", [])) or "1 run" for c in series]
            colour = _COLOURS[configs.index(name) % len(_COLOURS)]
            fig.add_trace(go.Scatter(x=x, y=y, error_y=err, name=name, mode="lines+markers", customdata=reps,
                                     line=dict(color=colour, width=2.5), marker=dict(size=8), legendgroup=name,
                                     showlegend=col == 1,
                                     hovertemplate=f"{label}, {name}<br>%{{x}}: %{{y:.2f}}× (repeats %{{customdata}})"
                                                   "<extra></extra>"), row=1, col=col)
    lo, hi = min(ticks), max(ticks)
    for col in range(1, len(labels) + 1):
        fig.add_trace(go.Scatter(x=[lo, hi], y=[1, 1], mode="lines", name="target-only (ratio 1)",
                                 line=dict(color="#9a9a9a", width=2), showlegend=col == 1, legendgroup="target-only",
                                 hoverinfo="skip"), row=1, col=col)
        if goal:
            fig.add_trace(go.Scatter(x=list(goal), y=list(goal.values()), mode="markers", name="goal",
                                     marker=dict(symbol="line-ew-open", size=30, color="#b2182b",
                                                 line=dict(width=3, color="#b2182b")),
                                     showlegend=col == 1, legendgroup="goal",
                                     hovertemplate="goal at %{x}: %{y:.2f}×<extra></extra>"), row=1, col=col)
    first = next(iter(results.values()))
    repeats = sorted({r.get("repeats") or 1 for r in results.values()})
    extra = (f"model {first['model']} · median of {'/'.join(map(str, repeats))} paired repeats, bars: min-max · "
             + " · ".join(f"{label}: temperature {r.get('temperature', 0.0):g}" for label, r in results.items()))
    xlabel = "request rate (requests/s)" if mode == "open" else "concurrent clients (closed loop)"
    _layout(fig, title or f"EAGLE over target-only with its spread ({mode} loop)", result_subtitle(first, extra),
            height=460, legend_y=-0.22, bottom=120, subplot_titles=True)
    fig.update_xaxes(title_text=xlabel, type="log", tickvals=sorted(ticks), ticktext=[f"{t:g}" for t in sorted(ticks)])
    fig.update_yaxes(rangemode="tozero", ticksuffix="×")
    return fig


def spread_table(results: Mapping[str, Mapping], mode: str = "closed") -> str:
    """Per result, load point and EAGLE config: target-only's and the config's output tokens/s, median
    [min–max], and the ratio's median [min–max] with every repeat's ratio, as a Markdown table."""
    out = []
    for label, r in results.items():
        base = {_load(x): x for x in r["results"] if x["config"] == "target-only" and x["mode"] == mode
                and x.get("traffic", "steady") == "steady"}
        mine = {(x["config"], _load(x)): x for x in r["results"] if x["mode"] == mode}
        for c in sorted(_rows(r, mode), key=lambda c: (_load(c), c["config"])):
            b, m = base.get(_load(c)), mine.get((c["config"], _load(c)))
            tok = lambda row: _spread(row["output_throughput"], row.get("output_throughput_min"),  # noqa: E731
                                      row.get("output_throughput_max"), ",.0f") if row else "–"
            out.append([label, _label(c), c["config"], tok(b), tok(m),
                        _spread(c["output_throughput_ratio"], c.get("output_throughput_ratio_min"),
                                c.get("output_throughput_ratio_max"), ".2f", "×"),
                        ", ".join(f"{v:.2f}" for v in c.get("output_throughput_ratio_reps", [])) or "–"])
    return markdown_table(["result", "load", "config", "target-only tok/s", "config tok/s", "ratio", "each repeat"], out)


def kauto_table(result: Mapping) -> str:
    """`--k auto`'s verdicts (`result["kauto"]`) per point: traffic, load, auto's tokens/s, the ratios over
    target-only and over the best fixed k (median [min–max]) and each rule's verdict."""
    k = result.get("kauto")
    if not k or not k.get("points"):
        raise ValueError("no `kauto` verdicts in this result: run bench serve with a HEAD:auto config (and a "
                         "fixed HEAD:K of the same head)")
    mark = {True: "met", False: "**missed**", None: "–"}
    rows = []
    for p in k["points"]:
        ratio = lambda v: _spread(v["median"], v["min"], v["max"], ".2f", "×") if v else "–"  # noqa: E731
        a = p["auto_tok_s"]
        rows.append([p["traffic"], _label(p), _spread(a["median"], a["min"], a["max"], ",.0f"),
                     ratio(p["over_target_only"]), f"{p['best_fixed'] or '–'}: {ratio(p['over_best_fixed'])}",
                     ", ".join(f"{rule.replace('_', ' ')} {mark[v]}" for rule, v in p["verdicts"].items() if v is not None)])
    return markdown_table(["traffic", "load", "k auto tok/s", "over target-only", "over the best fixed k", "verdicts"],
                          rows)
