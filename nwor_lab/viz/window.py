"""One verify window's tokens per request, coloured by fate, with the accepted length marked.

Row r lists request r's scheduled tokens left to right: `t_last, d_1 .. d_k` for a speculative
request, its tokens for a prefill / plain decode. A thick bar after the kept prefix marks the
accepted length `a_r`: `t_last, d_1 .. d_{a_r}` are kept, the drafts after the bar are rejected.
"""
from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from nwor_lab.viz.states import token_labels
from nwor_lab.viz.categories import add_category_legend
from nwor_lab.viz.theme import (CELL_FONT, KEPT, LEGEND_PX, PADDING, PENDING, REJECTED, TOKEN_COLOURS, TOKEN_MEANING,
                                base_layout, discrete_colorscale)

__all__ = ["window_timeline", "window_timelines", "token_fates"]

_FATES = [KEPT, REJECTED, PENDING, PADDING]


def token_fates(window, draft_mask: torch.Tensor | None) -> list[str]:
    """Per window row: "padding" (slot -1), "kept", "rejected", or "pending" (mask not known).
    draft_mask: `[Dtot]` bool (request-major, like draft_token_ids) or None."""
    fates = [KEPT] * window.num_tokens
    rows = window.draft_rows.tolist()
    mask = None if draft_mask is None else torch.as_tensor(draft_mask).bool().tolist()
    for i, t in enumerate(rows):
        fates[t] = PENDING if mask is None else (KEPT if mask[i] else REJECTED)
    for t, s in enumerate(window.slot_mapping.tolist()):
        if s < 0:
            fates[t] = PADDING
    return fates


def _split(acceptance):
    """(draft_mask, accepted_len) from an Acceptance, a draft mask tensor, or None."""
    if acceptance is None:
        return None, None
    if hasattr(acceptance, "draft_mask"):
        return acceptance.draft_mask, acceptance.accepted_len
    return acceptance, None


def window_timeline(window, acceptance=None, *, title: str = "Verify window: which tokens are kept",
                    subtitle: str | None = None) -> go.Figure:
    """The window's tokens per request, coloured kept / rejected / pending / padding.

    window:     a `nwor_lab.window.Window`
    acceptance: an `Acceptance` (draft mask and accepted lengths), a `[Dtot]` bool draft mask, or
                None (before the rejection sampler: drafts are "pending")
    """
    return window_timelines([dict(window=window, acceptance=acceptance)], title=title, subtitle=subtitle)


def window_timelines(panels: Sequence[dict], *, title: str, subtitle: str | None = None) -> go.Figure:
    """Timelines stacked top to bottom (e.g. expected vs got). panels: dicts with `window`,
    `acceptance` (as in window_timeline), optional `accepted_len` `[R]` and `title`."""
    n = len(panels)
    fig = make_subplots(rows=n, cols=1, vertical_spacing=0.12 if n > 1 else 0.0,
                        subplot_titles=[p.get("title", "") for p in panels] if n > 1 else None)
    width = 1
    heights = 0
    for i, p in enumerate(panels, start=1):
        mask, acc = _split(p.get("acceptance"))
        acc = p.get("accepted_len", acc)
        width = max(width, _add_timeline(fig, p["window"], mask, acc, row=i, show_bar_legend=(i == 1)))
        heights += max(p["window"].num_reqs, 1)
    add_category_legend(fig, [(TOKEN_MEANING[f], TOKEN_COLOURS[f]) for f in _FATES], row=1, col=1)
    fig.update_layout(**base_layout(title, subtitle), height=170 + LEGEND_PX + 34 * heights + 40 * (n - 1))
    fig.update_xaxes(title_text="token in the request's window (t_last, d1, d2, ...)", dtick=1,
                     showgrid=False, zeroline=False, range=[-0.5, width - 0.5])
    fig.update_yaxes(showgrid=False, zeroline=False, autorange="reversed", type="category")
    return fig


def _add_timeline(fig, window, draft_mask, accepted_len, row: int, show_bar_legend: bool) -> int:
    """Add one window's heatmap and accepted-length bars at `row`; returns the widest request."""
    fates = token_fates(window, draft_mask)
    names = token_labels(window)
    slots = window.slot_mapping.tolist()
    acc = None if accepted_len is None else [int(a) for a in torch.as_tensor(accepted_len).tolist()]
    width = max(window.num_scheduled_tokens, default=1)
    z, text, custom, ylabels = [], [], [], []
    bar_x, bar_y = [], []
    start = 0
    for r, n in enumerate(window.num_scheduled_tokens):
        k = window.num_draft_tokens[r]
        label = f"req {r}" + (f" · a={acc[r]}/{k}" if acc is not None and k else
                              (f" · k={k}" if k else " · no drafts"))
        ylabels.append(label)
        cols = range(start, start + n)
        z.append([_FATES.index(fates[t]) for t in cols] + [None] * (width - n))
        text.append([names[t][0].split(":")[1] for t in cols] + [""] * (width - n))
        custom.append([[t, slots[t], names[t][1], TOKEN_MEANING[fates[t]]] for t in cols] +
                      [[None] * 4] * (width - n))
        if acc is not None and k:
            x = (n - k) + acc[r] - 0.5   # right edge of the last kept token
            bar_x.append(x)
            bar_y.append(label)
        start += n
    if window.num_reqs == 0:
        z, text, custom, ylabels = [[None] * width], [[""] * width], [[[None] * 4] * width], ["(no requests)"]
    fig.add_trace(go.Heatmap(
        z=z, x=list(range(width)), y=ylabels, text=text, customdata=custom, texttemplate="%{text}",
        textfont=CELL_FONT, xgap=3, ygap=6, showscale=False, zmin=-0.5, zmax=len(_FATES) - 0.5,
        colorscale=discrete_colorscale([TOKEN_COLOURS[f] for f in _FATES]), name="tokens",
        hovertemplate="%{customdata[2]} (window row %{customdata[0]}, slot %{customdata[1]})"
                      "<br>%{customdata[3]}<extra></extra>"), row=row, col=1)
    if bar_x:
        # a category y axis has no "row +- 0.5": draw each bar as a tall "line-ns" marker
        fig.add_trace(go.Scatter(x=bar_x, y=bar_y, mode="markers",
                                 marker=dict(symbol="line-ns", size=30, line=dict(width=4, color="#111111")),
                                 name="accepted length (end of the kept prefix)", showlegend=show_bar_legend,
                                 legendgroup="acc", hoverinfo="skip"), row=row, col=1)
    return width
