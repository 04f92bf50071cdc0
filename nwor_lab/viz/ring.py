"""The ring of a sliding-window cache, drawn as a ring: one cell per slot, labelled with the
position it holds, at one moment of a verify window (after the window's writes, before attention).

    ring index i = position mod S        a window holds t_last at `start` and drafts after it;
    the window's queries need positions  start - W + 1 .. (the query at `start` needs the most)

Cells (`RING_MEANING`): `empty`, `outside` (a committed position no query of the window needs
any more), `live` (committed, still needed), `window` (this window's row, written into the
ring), `evicted` (a window row overwrote a position still needed: the corruption), `logged`
(the same overwrite, the old row saved in cow's log, which attention reads instead), and the
window rows that wait in the staging buffer (`staged`, drawn in a small inner ring) when the
policy keeps its window out of the ring.

Which of these a policy produces follows from what it declares (`window_in_buffer`,
`evicted_in_log`), never from its name.
"""
from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nwor_lab.viz.states import SlotState
from nwor_lab.viz.theme import HIGHLIGHT, STATE_COLOURS, base_layout

RING_MEANING = {
    "empty": "empty: no position yet",
    "outside": "committed, outside every query's window",
    "live": "committed, a query of the window needs it",
    "window": "this window's row, written into the ring",
    "evicted": "evicted while still needed (corruption)",
    "logged": "overwritten, the old row read from cow's log",
    "staged": "this window's row, waiting in the staging buffer",
}
RING_COLOURS = {
    "empty": STATE_COLOURS[SlotState.EMPTY],
    "outside": "#b9c7d8",
    "live": STATE_COLOURS[SlotState.COMMITTED],
    "window": STATE_COLOURS[SlotState.WRITTEN],
    "evicted": HIGHLIGHT,
    "logged": STATE_COLOURS[SlotState.LOGGED],
    "staged": STATE_COLOURS[SlotState.STAGED],
}


@dataclass(frozen=True)
class RingCell:
    index: int          # ring index
    state: str          # a key of RING_MEANING
    position: int       # the position the slot holds now (-1: none)
    lost: int = -1      # the position the window's write evicted (-1: none)


def ring_cells(ring_slots: int, sliding_window: int, start: int, num_tokens: int, *, window_in_buffer: bool = False,
               evicted_in_log: bool = False) -> tuple[list[RingCell], list[int]]:
    """The ring of one request whose positions 0 .. start-1 are committed, while a window of
    `num_tokens` rows (start ..) is open and written the policy's way -> (cells by ring index,
    staged window positions). A write-all policy puts the rows in the ring; `window_in_buffer`
    keeps them out; `evicted_in_log` marks the needed positions they overwrote as read from the log."""
    need = max(0, start - sliding_window + 1)
    cells = []
    for i in range(ring_slots):
        held = max((p for p in range(i, start, ring_slots)), default=-1)      # the latest committed one
        state = "empty" if held < 0 else ("live" if held >= need else "outside")
        cells.append(RingCell(i, state, held))
    staged = []
    for p in range(start, start + num_tokens):
        if window_in_buffer:
            staged.append(p)
            continue
        old = cells[p % ring_slots]
        lost = old.position if old.state == "live" else -1
        state = "window" if lost < 0 else ("logged" if evicted_in_log else "evicted")
        cells[p % ring_slots] = RingCell(old.index, state, p, lost)
    return cells, staged


def ring_figure(panels, *, ring_slots: int, sliding_window: int, start: int, num_tokens: int,
                title: str, subtitle: str | None = None) -> go.Figure:
    """Rings side by side, one per panel: `panels` is a list of (panel title, policy or a dict with
    `window_in_buffer` / `evicted_in_log`). Hover a cell for its slot's story."""
    n = len(panels)
    fig = make_subplots(rows=1, cols=n, specs=[[{"type": "polar"}] * n],
                        subplot_titles=[name for name, _ in panels], horizontal_spacing=0.06)
    width = 360 / ring_slots
    for col, (name, how) in enumerate(panels, start=1):
        flags = {f: bool(how.get(f) if isinstance(how, dict) else getattr(how, f, False))
                 for f in ("window_in_buffer", "evicted_in_log")}
        cells, staged = ring_cells(ring_slots, sliding_window, start, num_tokens, **flags)
        theta = [c.index * width for c in cells]
        hover = [f"ring index {c.index}: " + (f"position {c.position}" if c.position >= 0 else "empty")
                 + (f"<br>evicted position {c.lost}" if c.lost >= 0 else "") + f"<br>{RING_MEANING[c.state]}"
                 for c in cells]
        fig.add_trace(go.Barpolar(r=[1] * ring_slots, base=[1.2] * ring_slots, theta=theta, width=[width] * ring_slots,
                                  marker=dict(color=[RING_COLOURS[c.state] for c in cells], line=dict(color="#ffffff", width=1)),
                                  hovertext=hover, hoverinfo="text", showlegend=False), row=1, col=col)
        fig.add_trace(go.Scatterpolar(r=[1.7] * ring_slots, theta=theta, mode="text",
                                      text=[str(c.position) if c.position >= 0 else "" for c in cells],
                                      textfont=dict(size=9 if ring_slots > 20 else 11), hoverinfo="skip",
                                      showlegend=False), row=1, col=col)
        lost = [c for c in cells if c.lost >= 0]
        if lost:       # the evicted positions, just outside their cells
            fig.add_trace(go.Scatterpolar(r=[2.5] * len(lost), theta=[c.index * width for c in lost], mode="text",
                                          text=[f"was {c.lost}" for c in lost],
                                          textfont=dict(size=9, color=RING_COLOURS[lost[0].state]),
                                          hoverinfo="skip", showlegend=False), row=1, col=col)
        if staged:     # the staging buffer: an inner arc at the window's ring indices
            fig.add_trace(go.Barpolar(r=[0.5] * len(staged), base=[0.5] * len(staged),
                                      theta=[p % ring_slots * width for p in staged], width=[width] * len(staged),
                                      marker=dict(color=RING_COLOURS["staged"], line=dict(color="#ffffff", width=1)),
                                      hovertext=[f"position {p}: {RING_MEANING['staged']}" for p in staged],
                                      hoverinfo="text", showlegend=False), row=1, col=col)
    for state, colour in RING_COLOURS.items():     # one legend for every panel
        fig.add_trace(go.Scatterpolar(r=[None], theta=[None], mode="markers", name=RING_MEANING[state],
                                      marker=dict(symbol="square", size=13, color=colour,
                                                  line=dict(color="#999999", width=1))), row=1, col=1)
    polar = dict(radialaxis=dict(visible=False, range=[0, 2.7]),
                 angularaxis=dict(visible=False, direction="clockwise", rotation=90))
    fig.update_layout(**base_layout(title, subtitle), height=470,
                      **{f"polar{'' if i == 1 else i}": polar for i in range(1, n + 1)})
    fig.update_layout(margin_t=fig.layout.margin.t + 30)    # room for the panel titles
    return fig


def strategies_figure(rows, *, title: str = "Sliding-window strategies side by side",
                      subtitle: str | None = None) -> go.Figure:
    """The rows of `nwor_lab.bench.ring.compare_strategies` (or a `bench ring` JSON's `results`) as
    three panels per strategy: tokens/s, KV memory per request (kept for its life, plus what the
    policy holds during a window) and tokens per request and decode step; a bar is green when the
    strategy's output equals target-only (✓), red when it does not (✗)."""
    rows = [r for r in rows if r.get("k")]
    names = [r["strategy"] for r in rows]
    ok = ["#4db58a" if r["correct"] else HIGHLIGHT for r in rows]
    marks = ["✓" if r["correct"] else "✗" for r in rows]
    fig = make_subplots(rows=1, cols=3, horizontal_spacing=0.08,
                        subplot_titles=["tokens/s", "KV memory per request (KiB)", "tokens per request step"])
    fig.add_trace(go.Bar(x=names, y=[r["tokens_per_s"] for r in rows], marker_color=ok, text=marks,
                         textposition="outside", showlegend=False), row=1, col=1)
    mem = [r["kv_memory_per_request"] for r in rows]
    fig.add_trace(go.Bar(x=names, y=[m["persistent_bytes"] / 1024 for m in mem], name="kept for the request's life",
                         marker_color=STATE_COLOURS[SlotState.COMMITTED]), row=1, col=2)
    fig.add_trace(go.Bar(x=names, y=[m["transient_bytes"] / 1024 for m in mem], name="held during a window "
                         "(staging / log rows)", marker_color=STATE_COLOURS[SlotState.STAGED]), row=1, col=2)
    steps = [r.get("tokens_per_request_step") or r.get("mean_acceptance_length") or 0 for r in rows]
    fig.add_trace(go.Bar(x=names, y=steps, marker_color=ok, text=marks, textposition="outside", showlegend=False),
                  row=1, col=3)
    fig.update_layout(**base_layout(title, subtitle), barmode="stack", height=470)
    fig.update_layout(margin_t=fig.layout.margin.t + 24, margin_b=150)
    fig.update_xaxes(tickangle=-35)
    return fig
