"""One palette and one look for every lab figure.

A slot state or a token fate has the same colour in every figure (cache grid, window timeline,
stepper, exercise counterexamples), so a reader learns it once. Colours are Okabe-Ito-like hues,
light enough for black cell text, told apart by colour-blind readers.
"""
from __future__ import annotations

import textwrap

from nwor_lab.viz.states import SlotState

# SlotState -> colour. Order = the legend order (the life of a slot, roughly).
STATE_COLOURS = {
    SlotState.EMPTY: "#ececec",
    SlotState.COMMITTED: "#5b8fd0",   # blue: K/V of a kept token
    SlotState.STAGED: "#f2b134",      # amber: waits in the staging buffer, not in the cache
    SlotState.WRITTEN: "#a9d4f2",     # light blue: written, fate not decided
    SlotState.REJECTED: "#e0603a",    # vermillion: rejected K/V left in the cache
    SlotState.LOGGED: "#b98bd6",      # violet: old contents saved to the CoW log
    SlotState.RESTORED: "#4db58a",    # green: rejected, bits restored from the log
    SlotState.OLD: "#c9b99b",         # sand: bits from before, no kept token (freed, stale, evicted)
}

# Token fates in a window (window_timeline); same hues as the slot states they lead to.
KEPT, REJECTED, PENDING, PADDING = "kept", "rejected", "pending", "padding"
TOKEN_COLOURS = {
    KEPT: STATE_COLOURS[SlotState.COMMITTED],
    REJECTED: STATE_COLOURS[SlotState.REJECTED],
    PENDING: STATE_COLOURS[SlotState.WRITTEN],
    PADDING: "#ffffff",
}
TOKEN_MEANING = {
    KEPT: "kept (its K/V is committed)",
    REJECTED: "rejected draft",
    PENDING: "fate not decided yet",
    PADDING: "padding (slot -1, writes nothing)",
}

# Quantities in the cost figure.
COST_COLOURS = {
    "written": STATE_COLOURS[SlotState.COMMITTED],
    "skipped": STATE_COLOURS[SlotState.STAGED],
    "logged": STATE_COLOURS[SlotState.LOGGED],
    "restored": STATE_COLOURS[SlotState.RESTORED],
    "launches": "#666666",
}

LEGEND_PX = 80          # figure height reserved for the legend under the plot
HIGHLIGHT = "#c00000"   # outline of cells a checker found wrong
FONT = dict(family="Inter, Helvetica, Arial, sans-serif", size=13, color="#222222")
CELL_FONT = dict(family="Menlo, Consolas, monospace", size=10, color="#111111")


def base_layout(title: str, subtitle: str | None = None, **extra) -> dict:
    """Layout shared by all figures: white background, title (with an optional subtitle line)."""
    t = {"text": title, "x": 0.0, "xanchor": "left"}
    lines = 0
    if subtitle:
        subtitle = wrap(subtitle)
        lines = subtitle.count("<br>") + 1
        t["subtitle"] = {"text": subtitle, "font": {"size": 12, "color": "#555555"}}
    layout = dict(title=t, font=FONT, plot_bgcolor="#ffffff", paper_bgcolor="#ffffff",
                  margin=dict(l=70, r=20, t=64 + 17 * lines, b=50 + LEGEND_PX),
                  # the legend sits at the bottom of the figure (container coordinates), below the
                  # x-axis title whatever the plot's height; LEGEND_PX keeps room for ~3 rows of it
                  legend=dict(orientation="h", yref="container", yanchor="bottom", y=0.0, x=0.0,
                              xanchor="left"))
    layout.update(extra)
    return layout


def wrap(text: str, width: int = 100) -> str:
    """Break a caption into lines of at most `width` characters for a plotly title (`<br>`)."""
    return "<br>".join(textwrap.wrap(text, width)) if "<br>" not in text else text


def discrete_colorscale(colours: list[str]) -> list[list]:
    """A heatmap colour scale where integer z = i takes `colours[i]` exactly (with zmin=-0.5,
    zmax=len-0.5): two stops per band, so no blending between neighbouring states."""
    n = len(colours)
    scale = []
    for i, c in enumerate(colours):
        scale += [[i / n, c], [(i + 1) / n, c]]
    return scale
