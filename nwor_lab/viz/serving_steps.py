"""Where a serving run's step time goes, by kind of step (`bench serve`'s `steps_by_kind`).

  step_time_by_kind   one panel per load (closed loop: clients), a stacked bar per (config, result):
                      milliseconds of steps per 1,000 output tokens, split into steps with a prefill,
                      decode steps pre-launched (their host work hidden behind the step before) and decode
                      steps the host laid out after the readback (their host work in the step's time)
  step_kinds_table    the same rows as a Markdown table: steps and mean ms of each kind

Per 1,000 output tokens, so that two runs of the same workload compare bar for bar: a shorter bar is
a faster run. Everything is read from the JSON; nothing is measured.
"""
from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nwor_lab.viz.perf import _layout, result_subtitle
from nwor_lab.viz.tables import markdown_table

KINDS = ("prefill", "decode, host", "decode, pre-launched")
_COLOURS = {"prefill": "#e69f00", "decode, host": "#d55e00", "decode, pre-launched": "#56b4e9"}
_NAMES = {"prefill": "steps with a prefill", "decode, host": "decode, laid out by the host after the readback",
          "decode, pre-launched": "decode, pre-launched (host work hidden)"}


def _rows(results: Mapping[str, Mapping], configs) -> list[tuple[str, Mapping]]:
    """(result label, row) of the closed-loop steady rows that carry `steps_by_kind`, of `configs`
    (None: every config found in all results)."""
    found = {label: [r for r in res.get("results", []) if r.get("mode") == "closed"
                     and r.get("traffic", "steady") == "steady" and r.get("steps_by_kind")]
             for label, res in results.items()}
    if configs is None:
        names = [set(r["config"] for r in rows) for rows in found.values()]
        configs = [c for c in dict.fromkeys(r["config"] for rows in found.values() for r in rows)
                   if all(c in n for n in names)]
    out = [(label, r) for label, rows in found.items() for r in rows if r["config"] in configs]
    if not out:
        raise ValueError("no closed-loop rows with steps_by_kind for these configs: the files were written "
                         "before bench serve recorded the kinds of steps")
    return out


def _ms_per_1k(row: Mapping, kind: str) -> float:
    k = row["steps_by_kind"][kind]
    return (k["steps"] * (k["mean_ms"] or 0.0)) / max(1, row["total_output_tokens"]) * 1e3


def step_time_by_kind(results: Mapping[str, Mapping], configs=None, *, title: str | None = None):
    """Stacked bars per load: ms of steps per 1,000 output tokens by kind of step, for each config in
    each result ({label: bench serve result}, e.g. {"before": r0, "after": r1})."""
    rows = _rows(results, configs)
    loads = sorted({r["concurrency"] for _, r in rows})
    # each load on its own scale: a run at 32 clients takes a fraction of the 8 clients' ms per token
    fig = make_subplots(rows=1, cols=len(loads), horizontal_spacing=0.08,
                        subplot_titles=[f"{n} clients" for n in loads])
    for col, n in enumerate(loads, start=1):
        # each config's runs next to each other (before, after), configs in their order of first appearance
        order = list(dict.fromkeys(r["config"] for _, r in rows))
        here = sorted(((label, r) for label, r in rows if r["concurrency"] == n),
                      key=lambda lr: (order.index(lr[1]["config"]), list(results).index(lr[0])))
        x = [f"{r['config'].split(' nwor=')[0]}<br>{label}" for label, r in here]
        for kind in KINDS:
            fig.add_trace(go.Bar(x=x, y=[_ms_per_1k(r, kind) for _, r in here], name=_NAMES[kind],
                                 marker_color=_COLOURS[kind], legendgroup=kind, showlegend=col == 1,
                                 hovertemplate="%{x}: %{y:.0f} ms per 1,000 tokens<extra>" + _NAMES[kind] + "</extra>"),
                          row=1, col=col)
        totals = [sum(_ms_per_1k(r, kind) for kind in KINDS) for _, r in here]
        fig.add_trace(go.Scatter(x=x, y=totals, mode="text", text=[f"{t:.0f}" for t in totals],
                                 textposition="top center", showlegend=False, hoverinfo="skip"), row=1, col=col)
        fig.update_yaxes(range=[0, 1.15 * max(totals)], row=1, col=col)      # room for the totals' labels
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title_text="ms of steps per 1,000 output tokens", row=1, col=1)
    first = next(iter(results.values()))
    _layout(fig, title or "Where the step time goes while serving, by kind of step (shorter: faster)",
            result_subtitle(first), height=440, legend_y=-0.22, bottom=110, subplot_titles=True)
    return fig


def _rows_text(kind: Mapping) -> str:
    """", rows 231 → 240" (the requests' rows, the buffers' after padding) where the file has them."""
    if kind.get("mean_rows") and kind.get("mean_padded_rows"):
        return f", rows {kind['mean_rows']:.0f} → {kind['mean_padded_rows']:.0f}"
    return ""


def step_kinds_table(results: Mapping[str, Mapping], configs=None) -> str:
    """Per result, config and load: steps and mean ms of each kind of step (and their mean rows before
    and after padding, in files that have them), and output tokens/s."""
    body = []
    for label, r in _rows(results, configs):
        k = r["steps_by_kind"]
        body.append([label, r["config"].split(" nwor=")[0], str(r["concurrency"]),
                     *(f"{k[kind]['steps']} × {k[kind]['mean_ms']:.2f} ms{_rows_text(k[kind])}" if k[kind]["steps"]
                       else "–" for kind in KINDS),
                     f"{r['output_throughput']:,.0f}"])
    return markdown_table(["run", "config", "clients", *KINDS, "output tok/s"], body)
