"""Pictures of a tree window: the tree with its accepted path, where each strategy's bytes go, and the
positions n .. n + N after each strategy's commit.

  tree_figure(parents, labels, path)     the drafted tree, t_last at the left, depth to the right; the
                                         accepted path in the committed colour, rejected nodes in the
                                         rejected colour (the palette of every lab figure, theme.py)
  tree_costs_figure(rows)                `bench tree` rows of one shape: rows written per emitted
                                         token, bytes moved, stranded bytes, the commit's share of the step
  tree_vs_chain_figure(result)           acceptance length and head rows of a tree and a chain per verify size
  commit_strips(frames)                  one row per strategy: what each position n .. n + N of the
                                         request holds after the commit (from `tree_frames`' last frame)
"""
from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nwor_lab.policies.tree import STRATEGY_TITLES
from nwor_lab.speculative.tree_window import depths_of
from nwor_lab.viz.cache import add_state_legend, heatmap_style
from nwor_lab.viz.states import STATE_MEANING, SlotState
from nwor_lab.viz.theme import CELL_FONT, STATE_COLOURS, base_layout

__all__ = ["tree_layout", "tree_figure", "tree_costs_figure", "commit_strips", "tree_vs_chain_figure", "STRATEGY_COLOURS"]

# one colour per commit strategy, borrowed from the state each one leaves behind or works in
# (keyed by the strategy's title, policies.tree.STRATEGY_TITLES: what the bench's rows name)
STRATEGY_COLOURS = {STRATEGY_TITLES[s]: STATE_COLOURS[state] for s, state in (
    ("move", SlotState.REJECTED), ("remap", SlotState.OLD), ("cow", SlotState.LOGGED), ("stage", SlotState.STAGED))}


def tree_layout(parents: Sequence[int]) -> tuple[list[int], list[float]]:
    """(x, y) of rows 0 .. N (0 = t_last): x = depth, y = leaves in order top to bottom, a parent
    centred on its children."""
    n = len(parents)
    children = [[] for _ in range(n + 1)]
    for i, p in enumerate(parents, start=1):
        children[p].append(i)
    depth = [0] + depths_of(list(parents))
    y = [0.0] * (n + 1)
    leaf = [0]

    def place(i):                       # iterative would be longer; trees here are < 100 deep
        if not children[i]:
            y[i] = float(leaf[0])
            leaf[0] += 1
            return
        for c in children[i]:
            place(c)
        y[i] = sum(y[c] for c in children[i]) / len(children[i])
    place(0)
    return depth, [-v for v in y]


def tree_figure(parents: Sequence[int], labels: Sequence[str] | None = None, path: Sequence[bool] | None = None, *,
                title: str = "A drafted tree", subtitle: str | None = None, hover: Sequence[str] | None = None) -> go.Figure:
    """The tree of one request. parents[i]: node i+1's parent (0 = t_last); labels[i]: node i+1's text
    (its token); path: [N] bool, the accepted nodes (None: fate not decided, every node drawn as written)."""
    n = len(parents)
    labels = list(labels) if labels is not None else [str(i) for i in range(1, n + 1)]
    x, y = tree_layout(parents)
    on = [True] + (list(path) if path is not None else [False] * n)
    fig = go.Figure()
    for kept in (False, True):          # edges: the path drawn last, on top
        xs, ys = [], []
        for i, p in enumerate(parents, start=1):
            if (on[i] and path is not None) == kept:
                xs += [x[p], x[i], None]
                ys += [y[p], y[i], None]
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False,
                                 line=dict(color="#1f4e8c" if kept else "#b8b8b8", width=4 if kept else 1.5)))
    groups = [("t_last (position n)", [0], "#222222")]
    if path is None:
        groups.append(("drafted node (fate not decided)", list(range(1, n + 1)), STATE_COLOURS[SlotState.WRITTEN]))
    else:
        groups.append(("accepted path", [i for i in range(1, n + 1) if on[i]], STATE_COLOURS[SlotState.COMMITTED]))
        groups.append(("rejected node", [i for i in range(1, n + 1) if not on[i]], STATE_COLOURS[SlotState.REJECTED]))
    names = ["t_last"] + labels
    for name, idx, colour in groups:
        if not idx:
            continue
        text = [names[i] if i == 0 else f"{i}·{names[i]}" for i in idx]
        tips = [hover[i] if hover is not None else f"row {i}, depth {x[i]}" for i in idx]
        fig.add_trace(go.Scatter(x=[x[i] for i in idx], y=[y[i] for i in idx], mode="markers+text", name=name,
                                 text=text, textposition="middle right", hovertext=tips, hoverinfo="text",
                                 textfont=CELL_FONT, marker=dict(size=16, color=colour, line=dict(color="#333333", width=1))))
    leaves = max(1, int(-min(y)) + 1)
    fig.update_layout(**base_layout(title, subtitle))
    m = fig.layout.margin
    fig.update_layout(height=m.t + m.b + max(200, min(700, 26 * leaves)))     # ~26 px a leaf, room for small trees
    fig.update_yaxes(range=[min(y) - 0.7, 0.7])
    fig.update_xaxes(title_text="depth (the node's position is n + depth)", dtick=1, range=[-0.4, max(x) + 0.9],
                     showgrid=True, gridcolor="#eeeeee", zeroline=False)
    fig.update_yaxes(visible=False)
    return fig


def tree_costs_figure(rows: Sequence[Mapping], *, title: str = "Where each strategy's bytes go",
                      subtitle: str | None = None) -> go.Figure:
    """`bench tree` rows of one shape (one row per strategy): four panels of bars."""
    panels = [("rows written per emitted token", lambda r: r["rows_written_per_token"], "{:.2f}"),
              ("bytes moved inside the cache (KiB)", lambda r: r["bytes_moved"] / 1024, "{:.0f}"),
              ("rejected bytes stranded in blocks (KiB)", lambda r: r["stranded_bytes"] / 1024, "{:.0f}"),
              ("commit's share of the step (%)", lambda r: 100 * (r["commit_share"] or 0), "{:.1f}")]
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[0] for p in panels], horizontal_spacing=0.06)
    names = [r["strategy"] for r in rows]
    for col, (_, value, fmt) in enumerate(panels, start=1):
        vals = [value(r) for r in rows]
        fig.add_trace(go.Bar(x=names, y=vals, text=[fmt.format(v) for v in vals], textposition="outside",
                             marker_color=[STRATEGY_COLOURS.get(n, "#888888") for n in names], showlegend=False,
                             cliponaxis=False), row=1, col=col)
        fig.update_yaxes(range=[0, 1.25 * max(vals + [1e-9])], row=1, col=col)
    fig.update_layout(**base_layout(title, subtitle), height=440)
    fig.layout.margin.t += 26          # room for the panel titles under the subtitle
    fig.update_annotations(font_size=12)
    fig.update_xaxes(tickangle=-30)
    return fig


def commit_strips(final: Mapping[str, object], *, title: str = "Positions n .. n + N after the commit",
                  subtitle: str | None = None) -> go.Figure:
    """One row per strategy (`final[name]`: the commit frame of `tree_frames`), one column per position
    n .. n + N of request 0: the slot's state and which window row it holds (t, n3✓, n5✗, ...)."""
    names = list(final)
    z, text, custom = [], [], []
    width = 0
    for name in names:
        f = final[name]
        slots = f.region_slots
        width = max(width, len(slots))
        grid = f.grid().reshape(-1)
        z.append([int(grid[s]) for s in slots])
        text.append([f.marks.get(s, "") for s in slots])
        custom.append([[name, f"n + {i}", s, f.labels.get(s, STATE_MEANING[SlotState(int(grid[s]))])]
                       for i, s in enumerate(slots)])
    style = heatmap_style(True)
    style["hovertemplate"] = "%{customdata[0]}: position %{customdata[1]}, slot %{customdata[2]}<br>%{customdata[3]}" \
                             "<extra></extra>"
    fig = make_subplots(rows=1, cols=1)
    fig.add_trace(go.Heatmap(z=z, x=[f"n+{i}" if i else "n" for i in range(width)], y=names, text=text,
                             customdata=custom, **style), row=1, col=1)
    add_state_legend(fig)
    fig.update_layout(**base_layout(title, subtitle), height=170 + 44 * len(names))
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(title_text="position (one slot each; a block holds block_size of them)", type="category")
    return fig


def tree_vs_chain_figure(result: Mapping, *, title: str = "Tree or chain at the same verify size",
                         subtitle: str | None = None) -> go.Figure:
    """The stored by-hand tree-vs-chain rows (`benchmarks/results/tree_vs_chain_by_hand_cpu.json`, written by
    the retired `bench.tree_chain`; the engine's run of the question is `bench.tree_engine.tree_vs_chain`):
    mean acceptance length (tokens per verify step) of the chain and of each tree shape at each verify
    size, and the head rows each drafts per step."""
    rows = list(result["rows"])
    sizes = sorted({r["nodes"] for r in rows})
    kinds = ["chain", "deep tree (depth N)", "EAGLE-2 capped tree"]
    colours = dict(zip(kinds, (STATE_COLOURS[SlotState.COMMITTED], STATE_COLOURS[SlotState.STAGED],
                               STATE_COLOURS[SlotState.LOGGED])))

    def kind(r):
        return "chain" if r["drafter"] == "chain" else kinds[1] if r["depth"] == r["nodes"] else kinds[2]
    fig = make_subplots(rows=1, cols=2, subplot_titles=["tokens emitted per verify step (acceptance length)",
                                                        "head rows drafted per step"], horizontal_spacing=0.1)
    for name in kinds:
        by = {r["nodes"]: r for r in rows if kind(r) == name}
        if not by:
            continue
        x = [f"N = {n}" for n in sizes if n in by]
        shapes = [by[n].get("shape", name) for n in sizes if n in by]
        for col, key, fmt in ((1, "mean_acceptance_length", "{:.2f}"), (2, "draft_rows_per_step", "{:d}")):
            vals = [by[n][key] for n in sizes if n in by]
            fig.add_trace(go.Bar(x=x, y=vals, name=name, marker_color=colours[name], showlegend=col == 1,
                                 text=[fmt.format(v) for v in vals], textposition="outside", cliponaxis=False,
                                 hovertext=shapes, hoverinfo="text+y"), row=1, col=col)
    fig.update_layout(**base_layout(title, subtitle), barmode="group", height=440)
    fig.layout.margin.t += 26          # room for the panel titles under the subtitle
    fig.update_annotations(font_size=12)
    return fig
