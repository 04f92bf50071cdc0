"""Figures of chapter 01 (why the write discipline matters), one idea each.

  write_share_figure     K/V rows stage writes as a share of off's, against acceptance: the formula,
                         the lab's measurements, and the claim it answers
  step_worth_figure      a whole verify step against its KV write path and the bytes stage skips
  block_digest_figure    per block: equal content digests in two runs that differ only in rejected drafts?
  consumers_figure       what a consumer of blocks sees, per policy: rejected bytes shipped with the
                         blocks, per-block statistics raised by rejected K/V
  vllm_rejected_figure   rejected writes per vLLM step that reached / stayed in vLLM's own cache

Inputs are plain dicts and lists (what `nwor_lab.why` returns), so nothing here runs a model.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nwor_lab.viz.perf import MODE_COLOURS
from nwor_lab.viz.states import SlotState
from nwor_lab.viz.categories import add_category_legend, category_heatmap
from nwor_lab.viz.theme import CELL_FONT, LEGEND_PX, STATE_COLOURS, base_layout

__all__ = ["write_share_figure", "step_worth_figure", "block_digest_figure", "consumers_figure",
           "vllm_rejected_figure"]

SAME, DIFFERS = STATE_COLOURS[SlotState.COMMITTED], STATE_COLOURS[SlotState.REJECTED]


def write_share_figure(k: int, points: Sequence[Mapping], *, title: str = "What stage writes, as a share of off's writes",
                       subtitle: str | None = None) -> go.Figure:
    """The line `(1 + a) / (1 + k)` over the mean accepted drafts `a` in `[0, k]`, and `points`
    (dicts: `name`, `a`, `share`, optional `k` (default `k`: other k are drawn on their own line),
    `kind` "measured" | "claimed" | "recomputed", `note` for the hover)."""
    fig = go.Figure()
    ks = sorted({int(p.get("k", k)) for p in points} | {k})
    for i, kk in enumerate(ks):
        a = [kk * j / 40 for j in range(41)]
        fig.add_trace(go.Scatter(x=a, y=[(1 + x) / (1 + kk) for x in a], mode="lines",
                                 name=f"(1 + a) / (1 + k), k = {kk}", line=dict(color="#555555", dash=("solid", "dot")[i % 2]),
                                 hovertemplate=f"k = {kk}, a = %{{x:.2f}}: stage writes %{{y:.0%}} of off's<extra></extra>"))
    style = {"measured": dict(symbol="circle", size=12, line=dict(width=1, color="#222222")),
             "recomputed": dict(symbol="diamond", size=12, line=dict(width=1, color="#222222")),
             "claimed": dict(symbol="x", size=13, line=dict(width=1, color="#222222"))}
    palette = ["#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#999999"]
    for i, p in enumerate(points):
        kind = p.get("kind", "measured")
        colour = DIFFERS if kind == "claimed" else palette[i % len(palette)]
        fig.add_trace(go.Scatter(x=[p["a"]], y=[p["share"]], mode="markers+text", name=f"{p['name']} ({kind})",
                                 marker=dict(color=colour, **style[kind]), text=[f"{p['share']:.0%}"],
                                 textposition=p.get("textposition", "middle right"), textfont=dict(size=11),
                                 hovertemplate=f"{p['name']}<br>a = %{{x:.2f}} of k = {p.get('k', k)}: "
                                               f"%{{y:.1%}} of off's writes<br>{p.get('note', '')}<extra></extra>"))
    fig.update_layout(**base_layout(title, subtitle), height=520)
    # the upper left stays empty (the line starts at 1 / (1 + k) and rises): the legend goes there
    fig.update_layout(legend=dict(x=0.01, y=0.99, xanchor="left", yanchor="top", yref="paper", orientation="v",
                                  bgcolor="rgba(255,255,255,0.85)", font=dict(size=12)), margin_b=60)
    fig.update_xaxes(title_text="accepted drafts per speculative request and window (a)", range=[-0.1, max(ks) + 0.1],
                     zeroline=False)
    fig.update_yaxes(title_text="K/V rows written: stage ÷ off", tickformat=".0%", range=[0, 1.05])
    return fig


def step_worth_figure(parts: Sequence[tuple], *, title: str, subtitle: str | None = None) -> go.Figure:
    """Horizontal bars in µs on a log axis: `parts` = (label, µs, note[, colour]). For "a step
    against the pieces NWOR could change"."""
    labels = [p[0] for p in parts]
    colours = [p[3] if len(p) > 3 else MODE_COLOURS["stage"] for p in parts]
    fig = go.Figure(go.Bar(x=[p[1] for p in parts], y=labels, orientation="h", marker_color=colours,
                           text=[f"{p[1]:,.1f} µs" if p[1] >= 1 else f"{p[1]:.2f} µs" for p in parts],
                           textposition="outside", customdata=[p[2] for p in parts],
                           hovertemplate="%{y}: %{x:,.2f} µs<br>%{customdata}<extra></extra>"))
    fig.update_layout(**base_layout(title, subtitle), height=150 + 55 * len(parts) + 60, showlegend=False)
    fig.update_layout(margin_b=60)
    fig.update_xaxes(type="log", title_text="µs (log scale)", range=[-1.2, 5.3])
    fig.update_yaxes(autorange="reversed")
    return fig


def block_digest_figure(rows: Sequence[Mapping], *, title: str, subtitle: str | None = None) -> go.Figure:
    """A grid: one row per (policy, request), one column per verify window; a cell is blue when,
    right after that window, every block the request held has the same digest in the two runs,
    red when some differ (the cell says how many).
    rows: dicts with `label` ("off · prompt 0"), `differing` [blocks per window], `held` [blocks
    the request held per window], optional `tail_kib` [KiB past its kept length per window, run A]."""
    width = max(len(r["differing"]) for r in rows)
    z, text, custom = [], [], []
    for r in rows:
        n = len(r["differing"])
        tail = r.get("tail_kib", [0] * n)
        z.append([0 if d == 0 else 1 for d in r["differing"]] + [None] * (width - n))
        text.append(["=" if d == 0 else f"≠{d}" for d in r["differing"]] + [""] * (width - n))
        custom.append([[j, d, h, t] for j, (d, h, t) in enumerate(zip(r["differing"], r["held"], tail))] +
                      [[None] * 4] * (width - n))
    key = [("every block holds the same bytes in both runs (=)", SAME), ("≠n: n blocks hold different bytes", DIFFERS)]
    fig = go.Figure(category_heatmap(z, key, x=list(range(width)), y=[r["label"] for r in rows], text=text,
                                     customdata=custom, texttemplate="%{text}", textfont=dict(CELL_FONT, size=11),
                                     xgap=2, ygap=3,
                                     hovertemplate="%{y}, after verify window %{customdata[0]}:<br>%{customdata[1]} "
                                                   "of %{customdata[2]} blocks differ<br>run A holds "
                                                   "%{customdata[3]:.0f} KiB past its kept length<extra></extra>"))
    add_category_legend(fig, key, outline=False)
    fig.update_layout(**base_layout(title, subtitle), height=170 + LEGEND_PX + 28 * len(rows))
    fig.update_xaxes(title_text="after verify window (time →)", showgrid=False, dtick=2 if width > 16 else 1)
    fig.update_yaxes(autorange="reversed", showgrid=False)
    return fig


def consumers_figure(by_mode: Mapping[str, Mapping], *, title: str, subtitle: str | None = None) -> go.Figure:
    """Three panels, one bar per policy: rejected K/V a running request's blocks carry (KiB, mean
    over the moments right after each verify window: what shipping or offloading them whole moves),
    blocks whose write-time statistic (max |K|, an fp8 scale's amax) a rejected row raised, blocks
    whose statistic over their final bytes differs from the clean one. by_mode: policy -> dict with
    `tail_kib`, `raised_write_time`, `changed_final` (counts), `blocks` (layer-blocks in all)."""
    modes = list(by_mode)
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.09, subplot_titles=[
        "rejected K/V a running request's<br>blocks carry (KiB, mean)", "blocks whose write-time amax<br>"
        "a rejected row raised", "blocks whose amax over<br>their final bytes changed"])
    colours = [MODE_COLOURS.get(m, "#888888") for m in modes]
    for col, (key, fmt) in enumerate((("tail_kib", "{:.0f} KiB"), ("raised_write_time", "{:.0f}"),
                                      ("changed_final", "{:.0f}")), start=1):
        y = [by_mode[m][key] for m in modes]
        text = [fmt.format(v) + (f" of {by_mode[m]['blocks']}" if col > 1 else "") for v, m in zip(y, modes)]
        fig.add_trace(go.Bar(x=modes, y=y, marker_color=colours, text=text, textposition="outside", showlegend=False,
                             cliponaxis=False, hovertemplate="%{x}: %{text}<extra></extra>"), row=1, col=col)
        top = max(max(y), 1) * 1.3
        fig.update_yaxes(rangemode="tozero", range=[0, top], row=1, col=col,
                         dtick=None if col == 1 else max(1, round(top / 5)))   # counts: whole ticks
    fig.update_layout(**base_layout(title, subtitle), height=470, showlegend=False)
    fig.update_layout(margin_t=fig.layout.margin.t + 52, margin_b=60)   # room for the two-line panel titles
    fig.update_xaxes(title_text="write policy")
    return fig


def vllm_rejected_figure(rows: Sequence[Mapping], *, title: str, subtitle: str | None = None) -> go.Figure:
    """Two panels by speculative method (x) and write policy (bars): rejected rows x layers per
    vLLM step that reached vLLM's cache, and that were still there after the window
    (`nwor_lab.why.claims.vllm_rejected_writes` rows)."""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.06,
                        subplot_titles=["reached vLLM's cache", "still there after the window"])
    for col, key in ((1, "reached_per_step"), (2, "left_per_step")):
        for mode in modes:
            ys = [next(r[key] for r in rows if r["method"] == m and r["mode"] == mode) for m in methods]
            fig.add_trace(go.Bar(x=methods, y=ys, name=mode, legendgroup=mode, showlegend=col == 1,
                                 marker_color=MODE_COLOURS.get(mode, "#888888"), text=[f"{v:.0f}" for v in ys],
                                 textposition="outside", cliponaxis=False,
                                 hovertemplate=f"{mode}, %{{x}}: %{{y:.1f}} rejected row-layers per step<extra></extra>"),
                          row=1, col=col)
    top = max(r["reached_per_step"] for r in rows)
    fig.update_layout(**base_layout(title, subtitle), barmode="group", height=430 + LEGEND_PX)
    fig.update_layout(margin_t=fig.layout.margin.t + 24)
    fig.update_yaxes(title_text="rejected rows × layers per step", range=[0, top * 1.2], row=1, col=1)
    fig.update_xaxes(title_text="speculative method (k = 4)")
    return fig
