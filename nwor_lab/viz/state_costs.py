"""Chapter 13's measured figures: the output token by token under each state strategy against
target-only (the first diverging token outlined), the strategies' state memory per request (from
their declarations: `nwor_lab.state.memory_rows`), and the time of one window per strategy (rows of
`python -m nwor_lab.bench.state_window --json`)."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nwor_lab.viz.states import SlotState
from nwor_lab.viz.categories import add_category_legend, category_heatmap
from nwor_lab.viz.theme import CELL_FONT, HIGHLIGHT, LEGEND_PX, STATE_COLOURS, TOKEN_COLOURS, base_layout

SAME, DIFFERS = TOKEN_COLOURS["kept"], TOKEN_COLOURS["rejected"]


def divergence_figure(reference: list[int], runs: list[tuple[str, list[int]]], show=str, *, title: str,
                      subtitle: str | None = None, max_tokens: int = 32) -> go.Figure:
    """One row per run (label, generated token ids), the target-only row first: a cell per generated
    token (its text by `show`), coloured by whether it equals target-only's; each run's first
    differing token outlined."""
    n = min(max_tokens, max([len(reference)] + [len(t) for _, t in runs]))
    rows = [("target-only", reference)] + list(runs)
    z, text, hover, outlines = [], [], [], []
    for r, (label, toks) in enumerate(rows):
        zr, tr, hr = [], [], []
        first = None
        for j in range(n):
            if j >= len(toks):
                zr.append(None), tr.append(""), hr.append("")
                continue
            same = j < len(reference) and toks[j] == reference[j]
            if not same and first is None:
                first = j
            zr.append(0 if same else 1)
            label = show(toks[j])
            tr.append(label if len(label) <= 5 else label[:4] + "…")      # a cell holds ~5 characters
            hr.append(f"{label}, token {j}: {show(toks[j])!r}" + ("" if same else
                      f" — target-only has {show(reference[j])!r}" if j < len(reference) else ""))
        if first is not None:
            outlines.append((r, first))
        z.append(zr), text.append(tr), hover.append(hr)
    labels = [label for label, _ in rows]
    key = [("same token as target-only", SAME), ("differs from target-only", DIFFERS)]
    fig = go.Figure(category_heatmap(z, key, x=list(range(n)), y=labels, text=text, texttemplate="%{text}",
                                     textfont=CELL_FONT, customdata=hover, hovertemplate="%{customdata}<extra></extra>",
                                     xgap=2, ygap=2))
    for r, j in outlines:
        fig.add_shape(type="rect", x0=j - 0.5, x1=j + 0.5, y0=r - 0.5, y1=r + 0.5, line=dict(color=HIGHLIGHT, width=3))
        fig.add_annotation(x=j, y=-0.5, ax=0, ay=-20, text=f"{rows[r][0]}: first difference at token {j}",
                           showarrow=True, arrowcolor=HIGHLIGHT, arrowhead=2, yanchor="bottom", xanchor="left",
                           font=dict(color=HIGHLIGHT, size=12))
    add_category_legend(fig, key)
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="first differing token", hoverinfo="skip",
                             marker=dict(symbol="square-open", size=13, color=HIGHLIGHT, line=dict(width=3))))
    fig.update_layout(**base_layout(title, subtitle), height=200 + LEGEND_PX + 40 * len(rows),
                      width=min(1100, 180 + 34 * n))
    fig.update_layout(margin_t=fig.layout.margin.t + 50)     # room for the first-difference note above the grid
    fig.update_xaxes(title_text="generated token (index)", showgrid=False, zeroline=False, dtick=4)
    fig.update_yaxes(autorange="reversed", showgrid=False, zeroline=False)
    return fig


def _unit(nbytes: float) -> tuple[float, str]:
    for scale, unit in ((2 ** 30, "GiB"), (2 ** 20, "MiB"), (2 ** 10, "KiB")):
        if nbytes >= scale:
            return scale, unit
    return 1, "B"


def state_memory_figure(panels: list[tuple[str, list[dict]]], *, title: str = "State memory per request, by strategy",
                        subtitle: str | None = None) -> go.Figure:
    """One panel per model (title, `memory_rows` of its spec): per strategy the bytes held for the
    request's life (steady) and the peak while a window is open (steady + transient)."""
    fig = make_subplots(rows=1, cols=len(panels), horizontal_spacing=0.12)
    for c, (name, rows) in enumerate(panels, start=1):
        scale, unit = _unit(max(r["state_bytes_window"] for r in rows))
        names = [r["strategy"] for r in rows]
        for key, label, colour in (("state_bytes_steady", "held for the request's life", STATE_COLOURS[SlotState.COMMITTED]),
                                   ("state_bytes_window", "peak while a window is open", STATE_COLOURS[SlotState.STAGED])):
            vals = [r[key] / scale for r in rows]
            fig.add_trace(go.Bar(x=names, y=vals, name=label, marker_color=colour, showlegend=c == 1,
                                 text=[f"{v:,.1f}" for v in vals], textposition="outside", cliponaxis=False,
                                 hovertemplate="%{x}: %{y:,.2f} " + unit + "<extra>" + label + "</extra>"),
                          row=1, col=c)
        fig.update_yaxes(title_text=f"{unit} per request", row=1, col=c, rangemode="tozero")
        fig.update_xaxes(title_text=f"strategy · {name}", row=1, col=c)
    fig.update_layout(**base_layout(title, subtitle), barmode="group", height=460 + LEGEND_PX,
                      width=1100 if len(panels) > 1 else 640)
    return fig


def state_time_figure(doc: dict, *, title: str | None = None, subtitle: str | None = None) -> go.Figure:
    """A `bench state_window` JSON document: one panel per batch size, per strategy the time of one
    window split into advancing the layers and the commit (median of the run's repeats)."""
    rows = doc["rows"]
    batches = sorted({r["batch"] for r in rows})
    fig = make_subplots(rows=1, cols=len(batches), horizontal_spacing=0.1,
                        subplot_titles=[f"batch {b}" for b in batches])
    for c, b in enumerate(batches, start=1):
        mine = [r for r in rows if r["batch"] == b]
        names = [r["strategy"] for r in mine]
        for key, label, colour in (("advance", "begin + every layer's conv and recurrence", STATE_COLOURS[SlotState.WRITTEN]),
                                   ("commit_ms", "commit", STATE_COLOURS[SlotState.LOGGED])):
            vals = [r["window_ms"] - r["commit_ms"] if key == "advance" else r[key] for r in mine]
            fig.add_trace(go.Bar(x=names, y=vals, name=label, marker_color=colour, showlegend=c == 1,
                                 hovertemplate="%{x}: %{y:.3f} ms<extra>" + label + "</extra>"), row=1, col=c)
        fig.add_trace(go.Scatter(x=names, y=[r["window_ms"] for r in mine], mode="text", showlegend=False,
                                 text=[f"{r['window_ms']:.2f}" for r in mine], textposition="top center",
                                 hoverinfo="skip", cliponaxis=False), row=1, col=c)
        fig.update_yaxes(title_text="ms per window" if c == 1 else None, row=1, col=c, rangemode="tozero")
        fig.update_xaxes(title_text="strategy", row=1, col=c)
    fig.update_layout(**base_layout(title or f"One verify window per strategy ({doc['shape']} shape, k = "
                                              f"{rows[0]['k']}, {doc['device']}, {doc['backend']} backend)", subtitle),
                      barmode="stack", height=440 + LEGEND_PX, width=1100 if len(batches) > 1 else 640)
    fig.update_layout(margin_t=fig.layout.margin.t + 24)
    return fig
