"""The paged cache of ONE layer as a grid: rows = blocks, columns = offsets in a block.

    slot = block * block_size + offset

Each cell is coloured by its `SlotState` (one colour per state, the same in every figure, with a
legend of all states so pictures of different phases compare at a glance). Hover shows the slot
id, block, offset, state and an optional per-slot label ("req 1 · d2"); `cell_text` writes a
short mark into the cell ("1:d2"), shortened to what a cell holds at the figure's block size
("d2✗", then "✗": `fit_marks`; the hover keeps the whole label); `highlight` outlines cells (a
checker's wrong slots). Figures take the notebook cell's width (no fixed pixel width: nothing is
cut off beside JupyterLab's open sidebar).
"""
from __future__ import annotations

import re
from typing import Mapping, Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from nwor_lab.viz.states import (LEGEND_ORDER, STATE_LEGEND, STATE_MEANING, SlotState, declared, layer_states,
                                 occupancy)
from nwor_lab.viz.categories import add_category_legend
from nwor_lab.viz.theme import (CELL_FONT, HIGHLIGHT, LEGEND_PX, STATE_COLOURS, base_layout,
                                discrete_colorscale, wrap)

__all__ = ["SlotState", "STATE_MEANING", "cache_grid", "cache_grids", "layer_states", "declared",
           "occupancy", "state_grid", "grid_cells", "fit_marks", "mark_chars", "add_state_legend"]

_STATES = list(SlotState)
_MEANING = {int(s): STATE_MEANING[s] for s in SlotState}


def state_grid(states, block_size: int) -> torch.Tensor:
    """`[NB, BS]` int8 from states given as `[NB, BS]` or flat `[NB * BS]` (tensor, array, list)."""
    t = torch.as_tensor(states).to(torch.int8)
    if t.dim() == 1:
        if t.numel() % block_size:
            raise ValueError(f"states: {t.numel()} slots is not a multiple of block_size={block_size}")
        t = t.view(-1, block_size)
    if t.dim() != 2 or t.shape[1] != block_size:
        raise ValueError(f"states: expected [num_blocks, {block_size}] (block_size columns) or a flat "
                         f"[num_slots] tensor, got shape {tuple(t.shape)}")
    return t


def cache_grid(states, *, title: str, block_size: int, annotations: Mapping[int, str] | None = None,
               cell_text: Mapping[int, str] | None = None, blocks: Sequence[int] | None = None,
               highlight: Sequence[int] = (), subtitle: str | None = None) -> go.Figure:
    """One layer's cache as a grid of slots coloured by state.

    states:      `[NB, BS]` or `[NB * BS]` ints (SlotState values)
    annotations: slot -> hover label, e.g. {13: "req 1 · d2"}
    cell_text:   slot -> short text drawn in the cell, e.g. {13: "1:d2"}
    blocks:      the blocks (rows) to draw, in order; default all (use it to crop big caches)
    highlight:   slots to outline in red (e.g. where a function under test went wrong)
    """
    return cache_grids([dict(states=states, annotations=annotations, cell_text=cell_text,
                             highlight=highlight)], title=title, block_size=block_size, blocks=blocks,
                       subtitle=subtitle)


def cache_grids(panels: Sequence[Mapping], *, title: str, block_size: int,
                blocks: Sequence[int] | None = None, subtitle: str | None = None) -> go.Figure:
    """Several grids of the same cache side by side, e.g. "expected" next to "your function".

    panels: dicts with `states` and optionally `title`, `annotations`, `cell_text`, `highlight`
    (as in `cache_grid`). All panels share the block rows and the legend.
    """
    grids = [state_grid(p["states"], block_size) for p in panels]
    nb = grids[0].shape[0]
    rows = list(range(nb)) if blocks is None else [int(b) for b in blocks]
    n = len(panels)
    fig = make_subplots(rows=1, cols=n, shared_yaxes=True, horizontal_spacing=0.04 if n > 1 else 0.0,
                        subplot_titles=[p.get("title", "") for p in panels] if n > 1 else None)
    chars = mark_chars(block_size * n)
    for i, (panel, grid) in enumerate(zip(panels, grids), start=1):
        _add_grid(fig, grid, rows, block_size, panel.get("annotations"), fit_marks(panel.get("cell_text"), chars),
                  panel.get("highlight", ()), col=i)
    add_state_legend(fig, any(len(p.get("highlight", ())) for p in panels))
    fig.update_layout(**base_layout(title, subtitle),
                      height=grid_height(len(rows), subtitle) + (30 if n > 1 else 0))
    if n > 1:   # room for the panel titles under the subtitle
        fig.update_layout(margin_t=fig.layout.margin.t + 24)
    fig.update_xaxes(title_text="offset in block", showgrid=False, zeroline=False,
                     tickmode="linear" if block_size <= 32 else "auto", dtick=1 if block_size <= 32 else None,
                     range=[-0.5, block_size - 0.5])
    fig.update_yaxes(showgrid=False, zeroline=False, autorange="reversed", type="category")
    fig.update_yaxes(title_text="block", col=1)
    return fig


def grid_cells(grid: torch.Tensor, rows: Sequence[int], block_size: int, annotations=None,
               cell_text=None) -> dict:
    """The heatmap's per-cell arrays for `rows` of a `[NB, BS]` state grid: `z`, `y`, `text`,
    `customdata` (slot, state meaning, label). The stepper updates a live figure with these."""
    annotations, cell_text = annotations or {}, cell_text or {}
    z, text, custom = [], [], []
    for b in rows:
        z.append([int(s) for s in grid[b].tolist()])
        slots = range(b * block_size, (b + 1) * block_size)
        text.append([cell_text.get(s, "") for s in slots])
        custom.append([[s, _MEANING[v], annotations.get(s, "")] for v, s in zip(z[-1], slots)])
    return dict(z=z, y=[f"{b}" for b in rows], text=text, customdata=custom)


# A notebook's output area is about 1050 px wide, about 700 px beside JupyterLab's open sidebar;
# marks are sized for the narrow case, at the cell font's ~6.5 px per character.
NARROW_PX = 700
CHAR_PX = 6.5
_MARK = re.compile(r"^(?:(?P<req>\d+):)?(?P<token>[^✓✗]*)(?P<fate>[✓✗]?)$")


def mark_chars(columns: int, width_px: int = NARROW_PX) -> int:
    """How many characters a cell holds when `columns` cells share a figure `width_px` wide."""
    return max(1, int((width_px - 100) / max(columns, 1) / CHAR_PX))


def fit_marks(marks: Mapping[int, str] | None, chars: int) -> dict:
    """Cell marks ("1:d2✗": request 1, draft 2, rejected) shortened alike until every one holds at
    most `chars` characters: without the request ("d2✗"), then the fate alone ("✗"; the token,
    "d2", where no fate is known yet), then the token's kind ("d", "p", "t"). The hover labels keep
    the whole name."""
    marks = dict(marks or {})
    parsed = {s: _MARK.match(m) for s, m in marks.items()}
    def level(i, slot):
        m, whole = parsed[slot], marks[slot]
        if m is None:
            return whole if i == 0 else whole[:chars]
        token, fate = m["token"], m["fate"]
        return (whole, token + fate, fate or token, fate or token.rstrip("0123456789"))[i]
    for i in range(4):
        out = {slot: level(i, slot) for slot in marks}
        if all(len(v) <= chars for v in out.values()):
            return out
    return {slot: v[:chars] for slot, v in out.items()}


def grid_height(num_rows: int, subtitle: str | None = None) -> int:
    """Figure height in px for `num_rows` block rows (cells about 30 px tall)."""
    return 150 + LEGEND_PX + 30 * num_rows + (17 * (wrap(subtitle).count("<br>") + 1) if subtitle else 0)


def heatmap_style(buffer: bool = False) -> dict:
    """The look every state heatmap shares: the discrete state colours, cell text, gaps, hover.
    buffer=True: a staging buffer / CoW log panel (customdata `[request label, window row, slot,
    meaning]`, see buffers.py) instead of cache slots (`[slot, state meaning, label]`)."""
    hover = ("%{customdata[0]} (window row %{customdata[1]}, slot %{customdata[2]})<br>%{customdata[3]}"
             "<extra></extra>" if buffer else
             "slot %{customdata[0]} (block %{y}, offset %{x})<br>%{customdata[1]}<br>%{customdata[2]}<extra></extra>")
    return dict(texttemplate="%{text}", textfont=CELL_FONT, xgap=2, ygap=2, showscale=False,
                colorscale=discrete_colorscale([STATE_COLOURS[s] for s in _STATES]), zmin=-0.5,
                zmax=len(_STATES) - 0.5, name="buffer rows" if buffer else "slots", hovertemplate=hover)


def _add_grid(fig, grid, rows, block_size, annotations, cell_text, highlight, col):
    fig.add_trace(go.Heatmap(**grid_cells(grid, rows, block_size, annotations, cell_text), x=list(range(block_size)),
                             **heatmap_style()), row=1, col=col)
    row_of = {b: i for i, b in enumerate(rows)}
    for s in highlight:
        b, o = divmod(int(s), block_size)
        if b in row_of:
            fig.add_shape(type="rect", x0=o - 0.5, x1=o + 0.5, y0=row_of[b] - 0.5, y1=row_of[b] + 0.5,
                          line=dict(color=HIGHLIGHT, width=3), row=1, col=col)


def add_state_legend(fig, with_highlight: bool = False) -> None:
    """One legend entry per state (all of them, always: the legend never changes between phases)."""
    add_category_legend(fig, [(STATE_LEGEND[s], STATE_COLOURS[s]) for s in LEGEND_ORDER], row=1, col=1)
    if with_highlight:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="differs from expected",
                                 marker=dict(symbol="square-open", size=13, color=HIGHLIGHT,
                                             line=dict(width=3)), hoverinfo="skip"), row=1, col=1)
