"""Counterexample pictures that are tables of labelled cells: "expected" beside "yours".

The cache pictures (`nwor_lab.viz.cache_grids`) draw slots; several exercises answer with ids,
row numbers or masks instead. `labelled_grids` draws each answer as a grid of cells, coloured by a
category (one colour per category, the lab's palette), with the value written in the cell and the
cells where the answer differs outlined — so a counterexample reads without hovering.
"""
from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nwor_lab.viz.theme import CELL_FONT, HIGHLIGHT, LEGEND_PX, base_layout, discrete_colorscale

MAX_WIDTH = 1100   # px: figures stay inside a notebook cell and a 1280 x 720 slide


def labelled_grids(panels: Sequence[dict], *, categories: Sequence[tuple[str, str]], title: str,
                   subtitle: str | None = None, x_title: str = "", stacked: bool = False,
                   cell_px: int = 40) -> go.Figure:
    """Grids of labelled cells, side by side (or stacked top to bottom).

    panels:     dicts with `z` (rows of category indices, None = no cell), `text` (rows of cell
                labels), `rows` (row labels), optional `cols` (column labels), `title`,
                `highlight` ([(row, col)] cells to outline) and `hover` (rows of hover texts)
    categories: (name, colour) per category index, in legend order
    """
    n = len(panels)
    rows_per_panel = [max(1, len(p["z"] or [[None]])) for p in panels]
    fig = make_subplots(rows=n if stacked else 1, cols=1 if stacked else n,
                        row_heights=rows_per_panel if stacked else None,
                        vertical_spacing=min(0.3, 110 / (30 * sum(rows_per_panel) + 110 * n)) if stacked and n > 1 else 0.0,
                        horizontal_spacing=0.08 if n > 1 and not stacked else 0.0,
                        subplot_titles=[p.get("title", "") for p in panels] if n > 1 else None)
    colours = [c for _, c in categories]
    widest = tallest = 1
    for i, p in enumerate(panels, start=1):
        row, col = (i, 1) if stacked else (1, i)
        z = p["z"] or [[None]]
        ncols = max((len(r) for r in z), default=1) or 1
        cols = p.get("cols") or [str(c) for c in range(ncols)]
        ylabels = p.get("rows") or [str(r) for r in range(len(z))]
        widest, tallest = max(widest, ncols), max(tallest, len(z))
        fig.add_trace(go.Heatmap(
            z=z, x=cols, y=ylabels, text=p.get("text") or [[""] * ncols], texttemplate="%{text}",
            textfont=CELL_FONT, xgap=2, ygap=2, showscale=False, zmin=-0.5, zmax=len(colours) - 0.5,
            colorscale=discrete_colorscale(colours), customdata=p.get("hover") or p.get("text"),
            hovertemplate="%{y} · %{x}<br>%{customdata}<extra></extra>"), row=row, col=col)
        for r, c in p.get("highlight", ()):
            fig.add_shape(type="rect", x0=c - 0.5, x1=c + 0.5, y0=r - 0.5, y1=r + 0.5,
                          line=dict(color=HIGHLIGHT, width=3), row=row, col=col)
    for name, colour in categories:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name, hoverinfo="skip",
                                 marker=dict(symbol="square", size=13, color=colour,
                                             line=dict(color="#999999", width=1))), row=1, col=1)
    if any(p.get("highlight") for p in panels):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="differs from expected",
                                 hoverinfo="skip", marker=dict(symbol="square-open", size=13, color=HIGHLIGHT,
                                                               line=dict(width=3))), row=1, col=1)
    per_panel = cell_px * widest + 40
    width = min(MAX_WIDTH, max(560, 180 + (per_panel if stacked else n * per_panel)))
    height = 150 + LEGEND_PX + (30 * sum(rows_per_panel) + 110 * (n - 1) if stacked else 30 * tallest + 40)
    layout = base_layout(title, subtitle)
    if n > 1:   # room for the panel titles under the subtitle
        layout["margin"] = dict(layout["margin"], t=layout["margin"]["t"] + 24)
    fig.update_layout(**layout, height=height + (24 if n > 1 else 0), width=width)
    fig.update_xaxes(showgrid=False, zeroline=False, type="category")
    fig.update_xaxes(title_text=x_title, row=n if stacked else 1, col=1 if stacked else None)
    fig.update_yaxes(showgrid=False, zeroline=False, autorange="reversed", type="category")
    return fig
