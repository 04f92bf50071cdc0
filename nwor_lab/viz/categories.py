"""Categorical cells and their key: a heatmap whose integer z = i is drawn in category i's colour
exactly, and a legend of one square per category (the heatmap shows no colour bar).

`categories` is a list of (name, colour) throughout: the heatmap takes the colours in order (z = i ->
categories[i]), the legend the names and colours. Figures with subplots pass `row` / `col` to the
legend as `add_trace` takes them.
"""
from __future__ import annotations

import plotly.graph_objects as go

from nwor_lab.viz.theme import discrete_colorscale

OUTLINE = dict(color="#999999", width=1)     # a pale square (e.g. "empty") stays visible in the legend


def category_heatmap(z, categories, **heatmap) -> go.Heatmap:
    """`go.Heatmap(z=z, **heatmap)` where z = i takes categories[i]'s colour, no blending, no colour bar."""
    colours = [c for _, c in categories]
    return go.Heatmap(z=z, showscale=False, zmin=-0.5, zmax=len(colours) - 0.5,
                      colorscale=discrete_colorscale(colours), **heatmap)


def add_category_legend(fig, categories, *, outline: bool = True, **where) -> None:
    """One legend entry per (name, colour): a square marker with no data, in the order given.
    `where`: `row` / `col` for a figure with subplots."""
    for name, colour in categories:
        marker = dict(symbol="square", size=13, color=colour, **({"line": OUTLINE} if outline else {}))
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name, hoverinfo="skip", marker=marker),
                      **where)
