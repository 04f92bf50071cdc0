"""The graphed step's paired ratios (`bench.step_pairs` results): T > 0 over T = 0, and each write
policy over `off`, each the median of per-repeat ratios with its min–max.

  temperature_figure   {label: result}: T 0.8 over T 0 (policy `off`) against the batch, one trace
                       per result with min–max bars, and the goal line
  ratio_table          {label: result}: per result and batch, every ratio as median [min–max]

Everything is read from the JSON; nothing is measured.
"""
from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go

from nwor_lab.viz.perf import _layout, result_subtitle
from nwor_lab.viz.tables import markdown_table, spread_text

_COLOURS = ["#999999", "#0072b2", "#e69f00", "#009e73"]


def _ratio(v: Mapping) -> str:
    return spread_text(v["median"], v["min"], v["max"], ".3f")


def temperature_figure(results: Mapping[str, Mapping], mode: str = "off", goal: float | None = 1.10,
                       title: str | None = None) -> go.Figure:
    """T 0.8 over T 0 of policy `mode` per batch, one trace a result (error bars: min–max of the repeats)."""
    fig = go.Figure()
    key = f"T0.8 {mode}"
    batches = set()
    for i, (label, result) in enumerate(results.items()):
        rows = sorted((r for r in result["results"] if key in r.get("over_T0", {})), key=lambda r: r["batch"])
        if not rows:
            raise ValueError(f"{label}: no {key!r} ratio in its results (step_pairs with --temperatures 0,0.8)")
        v = [r["over_T0"][key] for r in rows]
        batches.update(r["batch"] for r in rows)
        fig.add_trace(go.Scatter(
            x=[str(r["batch"]) for r in rows], y=[x["median"] for x in v], mode="lines+markers", name=label,
            marker={"size": 9, "color": _COLOURS[i % len(_COLOURS)]}, line={"color": _COLOURS[i % len(_COLOURS)]},
            error_y={"type": "data", "symmetric": False, "array": [x["max"] - x["median"] for x in v],
                     "arrayminus": [x["median"] - x["min"] for x in v]},
            hovertemplate="batch %{x}: %{y:.3f}×<extra>" + label + "</extra>"))
    if goal is not None:
        xs = [str(b) for b in sorted(batches)]
        fig.add_trace(go.Scatter(x=xs, y=[goal] * len(xs), mode="lines", name=f"goal ≤ {goal:.2f}×",
                                 line={"color": "#d55e00", "dash": "dash"}, hoverinfo="skip"))
    fig.update_xaxes(title_text="batch (requests in the step)", type="category")
    top = max(max(t.y) + max(t.error_y.array or [0]) for t in fig.data if t.error_y and t.error_y.array)
    fig.update_yaxes(title_text=f"step time, T 0.8 / T 0 ({mode})", range=[1.0, max(top, goal or 0) + 0.02])
    first = next(iter(results.values()))
    _layout(fig, title or "What sampling at T = 0.8 adds to the graphed 8B step", result_subtitle(first), height=460)
    return fig


def ratio_table(results: Mapping[str, Mapping]) -> str:
    """Per result and batch: T 0.8 over T 0 (each policy) and each policy over off (each temperature)."""
    rows = []
    for label, result in results.items():
        for r in sorted(result["results"], key=lambda r: r["batch"]):
            t = ", ".join(f"{k.split()[1]} {_ratio(v)}" for k, v in r.get("over_T0", {}).items())
            o = ", ".join(f"{k} {_ratio(v)}" for k, v in r.get("over_off", {}).items())
            rows.append([label, str(r["batch"]), str(r["reps"]), t or "–", o or "–"])
    return markdown_table(["run", "batch", "repeats", "T 0.8 over T 0", "policy over off"], rows)
