"""What the windows cost: acceptance per draft position, and bytes / launches per write policy.

Both figures read `WindowRecord`s (nwor_lab.metrics): a policy's `metrics.records`, a run's
`trace[i].record`, or `generate(...).trace`.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nwor_lab.viz.theme import COST_COLOURS, LEGEND_PX, STATE_COLOURS, base_layout
from nwor_lab.viz.states import SlotState

__all__ = ["acceptance_by_position", "position_counts", "costs_by_mode", "launches_per_window"]

_BYTES = [("written", "bytes_written", "written into the cache"),
          ("skipped", "bytes_skipped", "rejected, never written (stage)"),
          ("logged", "bytes_logged", "copied into the CoW log"),
          ("restored", "bytes_restored", "copied back from the CoW log")]


def _records(x) -> list:
    """Records from a list of WindowRecord / WindowTrace (`.record`) / LabMetrics (`.records`)."""
    if hasattr(x, "records"):
        x = x.records
    out = []
    for r in x:
        r = getattr(r, "record", r)
        if r is not None:
            out.append(r)
    return out


def position_counts(records) -> tuple[list[int], list[int]]:
    """`(drafted, accepted)` per draft position j = 1..k summed over windows: drafted[j-1] counts
    requests that drafted d_j, accepted[j-1] those that accepted it (so d_1..d_{j-1} too)."""
    drafted, accepted = [], []
    for r in _records(records):
        for j, (d, a) in enumerate(zip(r.drafts_by_position, r.accepted_by_position)):
            if j == len(drafted):
                drafted.append(0), accepted.append(0)
            drafted[j] += d
            accepted[j] += a
    return drafted, accepted


def acceptance_by_position(records_or_counts, *, title: str = "Acceptance rate per draft position",
                           subtitle: str | None = None) -> go.Figure:
    """Bars: the share of drafts d_j that were accepted, for each position j.

    records_or_counts: WindowRecords (list, LabMetrics, trace), or `(drafted, accepted)` per
    position (lists), or a dict name -> either of those (one bar colour per name, e.g. per k).
    Under the prefix rule d_j counts as accepted only if d_1..d_{j-1} were, so the bars fall with j;
    the hover also gives the conditional rate P(d_j accepted | d_{j-1} accepted).
    """
    series = records_or_counts if isinstance(records_or_counts, Mapping) else {"": records_or_counts}
    fig = go.Figure()
    palette = [STATE_COLOURS[SlotState.COMMITTED], "#e69f00", "#009e73", "#cc79a7", "#56b4e9"]
    for i, (name, data) in enumerate(series.items()):
        is_counts = isinstance(data, tuple) and len(data) == 2 and not hasattr(data[0], "mode")
        drafted, accepted = (list(data[0]), list(data[1])) if is_counts else position_counts(data)
        rate = [a / d if d else 0.0 for d, a in zip(drafted, accepted)]
        prev = [drafted[0] if drafted else 0] + accepted[:-1]
        cond = [a / p if p else 0.0 for a, p in zip(accepted, prev)]
        fig.add_trace(go.Bar(
            x=[f"d{j}" for j in range(1, len(drafted) + 1)], y=rate, name=name or "acceptance rate",
            marker_color=palette[i % len(palette)], text=[f"{a}/{d}" for d, a in zip(drafted, accepted)],
            textposition="outside", customdata=list(zip(accepted, drafted, cond)), showlegend=bool(name),
            hovertemplate="%{x}: %{customdata[0]} of %{customdata[1]} accepted (%{y:.0%})<br>"
                          "given the previous draft was accepted: %{customdata[2]:.0%}"
                          "<extra>%{fullData.name}</extra>"))
    fig.update_layout(**base_layout(title, subtitle), barmode="group", height=420 + LEGEND_PX)
    fig.update_xaxes(title_text="draft position j (d_j is verified after d_1 .. d_{j-1})")
    fig.update_yaxes(title_text="accepted / drafted", range=[0, 1.12], tickformat=".0%")
    return fig


def launches_per_window(mode: str, num_layers: int) -> float | None:
    """Kernel launches of one verify window for `mode`, if its policy class declares them
    (`launches_per_window(num_layers)` classmethod); None otherwise."""
    from nwor_lab.policies import POLICIES
    fn = getattr(POLICIES.get(mode), "launches_per_window", None)
    return None if fn is None else float(fn(num_layers))


def costs_by_mode(records_by_mode: Mapping[str, object], *, launches: Mapping[str, float] | None = None,
                  num_layers: int | None = None, title: str = "What each write policy moves per window",
                  subtitle: str | None = None) -> go.Figure:
    """Grouped bars of bytes per window (mean over windows) by mode; beside them, kernel launches
    per window when known.

    records_by_mode: mode -> WindowRecords (list, LabMetrics or trace), e.g. the same windows
        replayed through each policy.
    launches: mode -> kernel launches per verify window, to override or for modes that are not
        registered policies. Without it and with `num_layers`, each policy is asked what it
        declares, `POLICIES[mode].launches_per_window(num_layers)` (CUDA backend, L layers written:
        off L = one K+V write per layer; cow L + 2 = plus one log at begin and one restore at
        commit, all layers each; zero-copy stage 1 = one commit of all layers, the K/V projections
        having written its staging buffer). With neither, the launches panel is left out.
    """
    modes = list(records_by_mode)
    recs = {m: _records(records_by_mode[m]) for m in modes}
    if launches is None and num_layers is not None:
        known = {m: launches_per_window(m, num_layers) for m in modes}
        launches = {m: v for m, v in known.items() if v is not None} or None
    mean = {m: {key: (sum(getattr(r, key) for r in rs) / len(rs) if rs else 0.0) for _, key, _ in _BYTES}
            for m, rs in recs.items()}
    top = max([v for d in mean.values() for v in d.values()] + [1.0])
    scale, unit = next((s, u) for s, u in ((2**20, "MiB"), (2**10, "KiB"), (1, "B")) if top >= s)

    cols = 2 if launches else 1
    fig = make_subplots(rows=1, cols=cols, column_widths=[0.72, 0.28] if cols == 2 else None,
                        subplot_titles=(f"{unit} per window (mean)", "kernel launches per window")
                        if cols == 2 else None, horizontal_spacing=0.12)
    for short, key, meaning in _BYTES:
        fig.add_trace(go.Bar(x=modes, y=[mean[m][key] / scale for m in modes], name=f"{short}: {meaning}",
                             marker_color=COST_COLOURS[short],
                             customdata=[[mean[m][key], len(recs[m])] for m in modes],
                             hovertemplate="%{x}: %{customdata[0]:,.0f} bytes " + short +
                                           " per window (%{customdata[1]} windows)<extra></extra>"),
                      row=1, col=1)
    if launches:
        fig.add_trace(go.Bar(x=modes, y=[launches.get(m) for m in modes], name="kernel launches",
                             marker_color=COST_COLOURS["launches"], text=[launches.get(m) for m in modes],
                             textposition="outside",
                             hovertemplate="%{x}: %{y} launches per window<extra></extra>"), row=1, col=2)
        fig.update_yaxes(title_text="launches", rangemode="tozero", row=1, col=2)
        fig.update_xaxes(title_text="write policy", row=1, col=2)
    n = {m: len(rs) for m, rs in recs.items()}
    note = subtitle or ("windows: " + ", ".join(f"{m} {n[m]}" for m in modes) +
                        ("" if launches else " · launches unknown (pass launches=)"))
    fig.update_layout(**base_layout(title, note), barmode="group", height=440 + LEGEND_PX)
    fig.update_yaxes(title_text=f"{unit} per window", rangemode="tozero", row=1, col=1)
    fig.update_xaxes(title_text="write policy", row=1, col=1)
    return fig
