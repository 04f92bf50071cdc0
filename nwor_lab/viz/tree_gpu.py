"""Stored GPU runs of tree windows, read for chapter 14: the four commit strategies on the 8B shape
(`bench tree --model 8b --graphs --profile`), the tree-window attention's launch variants, and tree
against chain through the 8B engine (`bench.tree_engine 8b`).

Everything here reads the JSON those benchmarks wrote; nothing is measured. A `point` is
(N, batch): N verified nodes per request, `batch` requests in the window.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nwor_lab.policies.tree import STRATEGY_TITLES
from nwor_lab.viz.theme import base_layout

# the tree verify attention in torch.profiler's kernel names: the attention kernel (the keys below the
# tree, and before the two-kernel split the tree too), the tree-window kernel with its merge (since), the
# split merge (before, and every non-tree pass)
ATTENTION_KERNELS = ("_verify_attention_kernel", "_tree_window_kernel", "_merge_splits_kernel")
MOVE, STAGE = STRATEGY_TITLES["move"], STRATEGY_TITLES["stage"]


def attention_us(row: Mapping) -> float | None:
    """µs per step the verify attention's kernels took in a `bench tree` row's profile (the profile's top
    kernels: a small one can fall below them; None: not profiled)."""
    got = [float(k["us_per_step"]) for k in row.get("kernels") or () if k["kernel"] in ATTENTION_KERNELS]
    return sum(got) if got else None


def rows_by_point(data: Mapping) -> dict[tuple[int, int], dict[str, Mapping]]:
    """`bench tree` rows -> {(N, batch): {strategy: row}}, rows that failed left out."""
    out: dict[tuple[int, int], dict[str, Mapping]] = {}
    for r in data["rows"]:
        if "error" not in r:
            out.setdefault((r["nodes"], r["batch"]), {})[r["strategy"]] = r
    return out


def stage_vs_move(data: Mapping) -> list[dict]:
    """Per (N, batch): stage's graphed step, verify-attention time and commit over write-all + move's. The
    graphed ratio is the run's own summary where it has one (the bench pairs the strategies' repeats:
    `bench.ratios.step_ratio`), else the ratio of the two rows' medians.

    Returns rows {nodes, batch, graph_ratio, attention_ratio, attention_extra_ms (stage − move),
    graph_extra_ms (stage − move), commit_ms_move, commit_ms_stage}; a ratio > 1 means stage is slower.
    """
    out = []
    paired = (data.get("summary") or {}).get("stage_over_move_graph_step") or {}
    for (n, b), by in sorted(rows_by_point(data).items()):
        mv, st = by.get(MOVE), by.get(STAGE)
        if mv is None or st is None:
            continue
        att_mv, att_st = attention_us(mv), attention_us(st)
        g_mv, g_st = mv.get("graph_step_ms"), st.get("graph_step_ms")
        out.append({"nodes": n, "batch": b,
                    "graph_ratio": paired.get(f"N{n}_b{b}", g_st / g_mv) if g_mv and g_st else None,
                    "graph_extra_ms": g_st - g_mv if g_mv and g_st else None,
                    "attention_ratio": att_st / att_mv if att_mv and att_st else None,
                    "attention_extra_ms": (att_st - att_mv) / 1e3 if att_mv and att_st else None,
                    "commit_ms_move": mv["commit_ms"], "commit_ms_stage": st["commit_ms"]})
    return out


def strategy_table(data: Mapping, strategies: Sequence[str] = tuple(STRATEGY_TITLES.values())) -> str:
    """A text table of a `bench tree` run: per N and strategy, rows written per emitted token, KiB moved and
    stranded per request (mean over batch sizes), and the graphed step at each batch size (a strategy with
    no graphed step shows its eager step in parentheses)."""
    points = rows_by_point(data)
    batches, sizes = sorted({b for _, b in points}), sorted({n for n, _ in points})
    lines = [f"{'N':>3s} {'strategy':16s} {'rows/token':>10s} {'moved KiB':>9s} {'stranded KiB':>12s}   "
             + "  ".join(f"{'b' + str(b) + ' graph ms':>12s}" for b in batches)]
    for n in sizes:
        for s in strategies:
            rs = [points.get((n, b), {}).get(s) for b in batches]
            got = [r for r in rs if r]
            if not got:
                continue
            kib = {key: sum(r[key] / r["batch"] for r in got) / len(got) / 1024
                   for key in ("bytes_moved", "stranded_bytes")}
            steps = [f"{r['graph_step_ms']:12.2f}" if r and r.get("graph_step_ms") else
                     f"{'(eager ' + format(r['step_ms'], '.1f') + ')':>12s}" if r and r.get("step_ms") is not None
                     else f"{'–':>12s}" for r in rs]
            lines.append(f"{n:3d} {s:16s} {got[0]['rows_written_per_token']:10.2f} {kib['bytes_moved']:9.0f} "
                         f"{kib['stranded_bytes']:12.0f}   " + "  ".join(steps))
    return "\n".join(lines)


def kernel_us(row: Mapping, kernel: str) -> float | None:
    """µs per step one kernel took in a `bench tree` row's profile (None: not among its top kernels)."""
    return next((float(k["us_per_step"]) for k in row.get("kernels") or () if k["kernel"] == kernel), None)


def kernel_change(before: Mapping, after: Mapping, kernel: str, strategies: Sequence[str] = (MOVE, STAGE)) -> list[float]:
    """`kernel`'s µs per step in run `after` over run `before`, at every (point, strategy) both profiled."""
    b, a = rows_by_point(before), rows_by_point(after)
    out = []
    for p in sorted(set(a) & set(b)):
        for s in strategies:
            if s in a[p] and s in b[p]:
                x, y = kernel_us(b[p][s], kernel), kernel_us(a[p][s], kernel)
                if x and y:
                    out.append(y / x)
    return out


def launch_attention(runs: Mapping[str, Mapping], points: Sequence[tuple[int, int]],
                     strategies: Sequence[str] = (MOVE, STAGE)) -> list[dict]:
    """Verify-attention µs per step under each launch variant: rows {variant, strategy, (N, batch): µs}.

    `runs` maps a variant's name to its `bench tree` JSON; a point a run lacks is None."""
    out = []
    for variant, data in runs.items():
        by = rows_by_point(data)
        for s in strategies:
            row = {"variant": variant, "strategy": s}
            for p in points:
                r = by.get(p, {}).get(s)
                row[p] = attention_us(r) if r else None
            out.append(row)
    return out


def tree_vs_chain_engine(results: Sequence[Mapping]) -> list[dict]:
    """`bench.tree_engine 8b` result rows -> per (batch, N, policy): the tree's and the chain's tokens/s
    and acceptance lengths, and tree over chain. Rows with an error are left out."""
    by: dict[tuple, dict] = {}
    for r in results:
        if "error" not in r:
            by.setdefault((r["batch_size"], r["nodes"], r["nwor"]), {})[r["kind"]] = r
    out = []
    for (b, n, mode), kinds in sorted(by.items()):
        t, c = kinds.get("tree"), kinds.get("chain")
        if t is None or c is None:
            continue
        out.append({"batch": b, "nodes": n, "nwor": mode, "tree": t["tree"],
                    "tree_tok_s": t["tokens_per_s"], "chain_tok_s": c["tokens_per_s"],
                    "tree_over_chain": t["tokens_per_s"] / c["tokens_per_s"],
                    "tree_acceptance": t["mean_acceptance_length"], "chain_acceptance": c["mean_acceptance_length"],
                    "tree_step_ms": t["decode_step_ms"], "chain_step_ms": c["decode_step_ms"]})
    return out


def gap_widens_with_n(rows: Sequence[Mapping]) -> bool:
    """`tree_vs_chain_engine` rows: does tree over chain grow with N at every (batch, policy)?"""
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault((r["batch"], r["nwor"]), []).append(r)
    return all(all(a["tree_over_chain"] <= b["tree_over_chain"] for a, b in zip(g, g[1:]))
               for g in (sorted(g, key=lambda r: r["nodes"]) for g in groups.values()))


def _ratio_heatmap(fig, rows, key, col, zmax):
    nodes = sorted({r["nodes"] for r in rows})
    batches = sorted({r["batch"] for r in rows})
    at = {(r["nodes"], r["batch"]): r[key] for r in rows}
    z = [[at.get((n, b)) for b in batches] for n in nodes]
    text = [[f"{v:.3f}×" if v is not None else "–" for v in line] for line in z]
    fig.add_trace(go.Heatmap(z=z, x=[f"batch {b}" for b in batches], y=[f"N = {n}" for n in nodes], text=text,
                             texttemplate="%{text}", textfont=dict(size=16), zmin=2 - zmax, zmax=zmax, zmid=1,
                             colorscale=[[0, "#4db58a"], [0.5, "#f7f7f7"], [1, "#e0603a"]], showscale=col == 2,
                             colorbar=dict(title="stage / move", len=0.8), xgap=2, ygap=2,
                             hovertemplate="%{y}, %{x}: %{text}<extra></extra>"), row=1, col=col)


def stage_vs_move_figure(rows: Sequence[Mapping], *, title: str = "stage's tree step against write-all + move's",
                         subtitle: str | None = None) -> go.Figure:
    """Two heatmaps over N × batch from `stage_vs_move` rows: stage / move of the graphed step, and of the
    verify attention's kernel time per step. Green: stage faster; red: stage slower."""
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=["whole step, replayed from a CUDA graph",
                                        "verify-attention kernels' time per step"])
    vals = [r[k] for r in rows for k in ("graph_ratio", "attention_ratio") if r[k] is not None]
    zmax = max([1.05] + [abs(v - 1) + 1 for v in vals])
    _ratio_heatmap(fig, rows, "graph_ratio", 1, zmax)
    _ratio_heatmap(fig, rows, "attention_ratio", 2, zmax)
    fig.update_layout(**base_layout(title, subtitle), height=440)
    fig.layout.margin.b = 50            # no legend under the plot: the colour bar says it
    fig.layout.margin.t += 40           # room for the panel titles under the subtitle
    fig.update_yaxes(autorange="reversed")   # N grows downwards, as in the printed table
    fig.update_annotations(font_size=13)
    return fig


def tree_vs_chain_engine_figure(rows: Sequence[Mapping], *, title: str = "Tree or chain on the 8B engine",
                                subtitle: str | None = None) -> go.Figure:
    """`tree_vs_chain_engine` rows: tokens/s of the tree and the chain of the same verify size N, one panel
    per batch size, under each write policy."""
    batches = sorted({r["batch"] for r in rows})
    modes = sorted({r["nwor"] for r in rows})
    fig = make_subplots(rows=1, cols=len(batches), subplot_titles=[f"batch {b}" for b in batches],
                        horizontal_spacing=0.07)
    colours = {("chain", "off"): "#c9b99b", ("chain", "stage"): "#8c7a55",
               ("tree", "off"): "#a9d4f2", ("tree", "stage"): "#5b8fd0"}
    for col, b in enumerate(batches, start=1):
        for kind in ("chain", "tree"):
            for mode in modes:
                sel = [r for r in rows if r["batch"] == b and r["nwor"] == mode]
                vals = [r[f"{kind}_tok_s"] for r in sel]
                fig.add_trace(go.Bar(x=[f"N = {r['nodes']}" for r in sel], y=vals,
                                     name=f"{kind}, {'write-all + move' if mode == 'off' else mode}",
                                     marker_color=colours.get((kind, mode), "#888888"), showlegend=col == 1,
                                     text=[f"{v:.0f}" for v in vals], textposition="inside", textangle=-90,
                                     insidetextanchor="end", textfont=dict(size=11, color="#111111"),
                                     hovertemplate="%{x}: %{y:.0f} tok/s<extra></extra>"),
                              row=1, col=col)
        top = max(r[k] for r in rows if r["batch"] == b for k in ("tree_tok_s", "chain_tok_s"))
        fig.update_yaxes(range=[0, 1.05 * top], row=1, col=col)
    fig.update_yaxes(title_text="tokens/s (whole run)", row=1, col=1)
    fig.update_layout(**base_layout(title, subtitle), barmode="group", height=460, uniformtext_minsize=9,
                      uniformtext_mode="hide")
    fig.layout.margin.t += 40          # room for the panel titles under the subtitle
    fig.layout.margin.b = 90           # one legend row
    fig.update_annotations(font_size=13)
    return fig
