"""Figures of the benchmark results (`benchmarks/results/*.json`), with live runs beside them.

Each function takes a result as the benchmark wrote it (a dict, or the path of its JSON file)
and returns a plotly figure; `live=` adds a second result of the same benchmark (e.g. measured
in the notebook) drawn hatched / dashed beside the stored one.

  policy_window_time   µs per 32-layer verify window per write policy, eager vs one CUDA graph
                       (`nwor-lab bench policies`)
  policy_overhead      µs each policy adds to `off` under a CUDA graph, against its extra launches
  kernel_time          one op's µs vs tokens: eager, in a graph, the launch floors, the copy-bandwidth time
                       (`nwor-lab bench kernels`)
  kernel_bandwidth     achieved GB/s vs tokens per op, against the device copy bandwidth
  window_commit        one commit launch for all layers vs one write_kv launch per layer
  engine_throughput    tokens/s of speculative vs target-only decoding by batch size
                       (`nwor-lab bench engine`)
  step_ratio           a whole verify step's time under cow and stage relative to off, eager and
                       graphed, per batch and k (`nwor-lab bench step`)

A file that lacks what a figure needs raises `BenchmarkFileError` naming the file, the missing
key and the command that writes such a file.
"""
from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from nwor_lab.viz.states import SlotState
from nwor_lab.viz.theme import STATE_COLOURS, base_layout

__all__ = ["BenchmarkFileError", "load_result", "result_subtitle", "policy_window_time", "policy_overhead",
           "kernel_time", "kernel_bandwidth", "window_commit", "engine_throughput", "step_ratio"]

BASELINE = "index_copy_baseline"
# One colour per write policy in every figure: the slot state each policy is about.
MODE_COLOURS = {
    BASELINE: "#9a9a9a",
    "off": STATE_COLOURS[SlotState.COMMITTED],   # writes everything
    "cow": STATE_COLOURS[SlotState.LOGGED],      # logs and restores
    "stage": "#e69f00",                          # stages, commits once (amber, darker for bars)
}
MODE_NAMES = {BASELINE: "2× index_copy_ per layer"}
OP_COLOURS = {"write_kv": MODE_COLOURS["off"], "commit": MODE_COLOURS["stage"], "log_slots": MODE_COLOURS["cow"],
              "restore_slots": "#4db58a"}
_FALLBACK = ["#56b4e9", "#cc79a7", "#009e73", "#d55e00", "#0072b2"]
LIVE_PATTERN = "/"

# What each benchmark's JSON must hold for the figures (top level, then per row).
_SCHEMA = {
    "kernels": ("nwor-lab bench kernels --json", ("device", "torch", "copy_bandwidth_GBps", "empty_op_us",
                                                  "empty_op_in_graph_us", "sweeps"),
                ("shape", "op", "tokens", "us", "kernel_us", "bytes", "GBps")),
    "policies": ("nwor-lab bench policies --json", ("device", "torch", "results"),
                 ("requests", "tokens", BASELINE, "off")),
    "engine": ("nwor-lab bench engine --out FILE", ("device", "torch", "results"),
               ("batch_size", "config", "k", "tokens_per_s")),
    "step": ("nwor-lab bench step --json", ("device", "torch", "results"),
             ("model", "batch", "k", "rate", "none", "off", "cow", "stage")),
}
_ROWS = {"kernels": "sweeps", "policies": "results", "engine": "results", "step": "results"}
_WINDOW_COMMIT = ("layers", "tokens", "accepted", "commit_one_launch_us", "write_kv_per_layer_32_launches_us",
                  "commit_kernel_us", "write_kv_32_launches_in_graph_us")


class BenchmarkFileError(ValueError):
    """A benchmark result that a figure cannot read; the message names the file and the fix."""


def _fail(where: str, kind: str, what: str) -> BenchmarkFileError:
    return BenchmarkFileError(f"{where}: {what}; expected the JSON that `{_SCHEMA[kind][0]}` writes "
                              f"(see nwor_lab/bench/{kind}.py)")


def _require(obj: Any, keys, where: str, kind: str) -> None:
    if not isinstance(obj, Mapping):
        raise _fail(where, kind, f"expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in keys if k not in obj]
    if missing:
        raise _fail(where, kind, f"missing key{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}")


def load_result(source: str | os.PathLike | Mapping, kind: str) -> dict:
    """A `kind` ("kernels" | "policies" | "engine") benchmark result from a dict or a JSON file,
    checked to hold what the figures read."""
    if kind not in _SCHEMA:
        raise ValueError(f"kind={kind!r}: one of {', '.join(_SCHEMA)}")
    if isinstance(source, Mapping):
        where, result = f"{kind} result", source
    else:
        where = os.fspath(source)
        try:
            result = json.loads(Path(where).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise BenchmarkFileError(f"{where}: no such file; the stored results are in benchmarks/results/") from None
        except json.JSONDecodeError as err:
            raise _fail(where, kind, f"not valid JSON ({err})") from None
    _, top, per_row = _SCHEMA[kind]
    _require(result, top, where, kind)
    rows = result[_ROWS[kind]]
    if not isinstance(rows, list) or not rows:
        raise _fail(where, kind, f"{_ROWS[kind]!r} must be a non-empty list of rows")
    for i, row in enumerate(rows):
        _require(row, per_row, f"{where}: {_ROWS[kind]}[{i}]", kind)
    if kind == "policies":
        for i, row in enumerate(rows):
            for mode in _modes(row):
                _require(row[mode], ("eager_us", "graph_us"), f"{where}: results[{i}][{mode!r}]", kind)
    return dict(result)


def result_subtitle(result: Mapping, extra: str | None = None, *, live: Mapping | None = None) -> str:
    """`NVIDIA H200 · torch 2.11.0+cu130 · CUDA 13.0 · <shape> · measured <date>` (+ extra, + live)."""
    parts = [str(result["device"]), f"torch {result['torch']}"]
    if result.get("cuda"):
        parts.append(f"CUDA {result['cuda']}")
    if result.get("shape"):
        parts.append(str(result["shape"]))
    if result.get("date"):
        parts.append(f"measured {str(result['date'])[:10]}")
    text = " · ".join(parts)
    if extra:
        text += f". {extra}"
    if live is not None:
        text += f". Hatched / dashed: live on {live['device']} (torch {live['torch']})"
    return text


def _modes(row: Mapping) -> list[str]:
    """The policy columns of a policies row, in file order, the index_copy_ baseline first."""
    modes = [k for k, v in row.items() if isinstance(v, Mapping) and "eager_us" in v and k != BASELINE]
    return ([BASELINE] if BASELINE in row else []) + modes


def _colour(name: str, i: int, table: Mapping[str, str] = MODE_COLOURS) -> str:
    return table.get(name, _FALLBACK[i % len(_FALLBACK)])


def _window_label(row: Mapping) -> str:
    per = row["tokens"] // row["requests"] if row["requests"] else row["tokens"]
    return f"{row['requests']} × {per}"


def _load(stored, live, kind: str) -> tuple[dict, dict | None]:
    """The stored `kind` result and the live one (None when not given), each read and checked."""
    return load_result(stored, kind), None if live is None else load_result(live, kind)


def _sources(stored: dict, live: dict | None):
    """(result, suffix, is_live) for the stored result and, if given, the live one."""
    out = [(stored, "", False)]
    if live is not None:
        out.append((live, " · live", True))
    return out


def _layout(fig, title: str, subtitle: str, *, height: int, legend_y: float = -0.25,
            bottom: int = 120, subplot_titles: bool = False) -> None:
    """The lab's base layout; the legend goes below the x-axis title, and the top margin grows
    with the subtitle's lines (and the subplot titles' row). No fixed width: a figure takes the
    width of its notebook cell, JupyterLab's sidebar open or not."""
    layout = base_layout(title, subtitle)
    layout["margin"] = {**layout["margin"], "b": bottom, "t": layout["margin"]["t"] + (28 if subplot_titles else 10)}
    layout["legend"] = {**layout["legend"], "y": legend_y}
    fig.update_layout(**layout, height=height)


def _reference_line(fig, x, y: float, name: str, colour: str, dash: str = "dash", **where) -> None:
    """A horizontal reference as a legend entry (hline annotations misplace on log axes)."""
    fig.add_trace(go.Scatter(x=[min(x), max(x)], y=[y, y], mode="lines", name=name,
                             line=dict(color=colour, dash=dash, width=1.5),
                             hovertemplate=f"{name}<extra></extra>"), **where)


def _bar_style(is_live: bool, crowded: bool = False) -> dict:
    """Hatched bars for live results; where a group holds more bars than a label's width allows
    in a notebook beside JupyterLab's sidebar (more than 3), labels turn upright, so they neither
    overlap nor shrink to nothing."""
    style = dict(marker_pattern_shape=LIVE_PATTERN, opacity=0.85) if is_live else {}
    if crowded:
        style.update(textangle=-90, textfont_size=11, cliponaxis=False)
    return style


# -- write policies ---------------------------------------------------------------------------
def policy_window_time(policies, *, live=None, title: str = "One verify window's KV write path, per write policy"):
    """Grouped bars: µs per verify window (32 layers) for each mode and the `index_copy_` baseline,
    by window size (requests × (1 + k) tokens); left eager (driven from Python), right replayed
    as one CUDA graph. y axes are separate: the graph panel is about ten times lower."""
    stored, live = _load(policies, live, "policies")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("eager: launched from Python, host included",
                                        "replayed as one CUDA graph: GPU time only"))
    for result, suffix, is_live in _sources(stored, live):
        rows = result["results"]
        for i, mode in enumerate(_modes(rows[0])):
            name = MODE_NAMES.get(mode, mode) + suffix
            for col, key in ((1, "eager_us"), (2, "graph_us")):
                y = [r[mode][key] for r in rows]
                fig.add_trace(go.Bar(
                    x=[_window_label(r) for r in rows], y=y, name=name, legendgroup=name, showlegend=col == 1,
                    marker_color=_colour(mode, i), text=[f"{v:.0f}" for v in y], textposition="outside",
                    hovertemplate=f"{name}<br>%{{x}} tokens: %{{y:.1f}} µs ({key[:-3]})<extra></extra>",
                    **_bar_style(is_live, crowded=len(_modes(rows[0])) * (2 if live is not None else 1) > 3)),
                    row=1, col=col)
    _layout(fig, title, result_subtitle(stored, live=live), height=520, legend_y=-0.22,
            subplot_titles=True)
    # one label size for every bar (plotly would shrink the tallest bars' labels to fit their room)
    fig.update_layout(barmode="group", uniformtext=dict(minsize=10, mode="show"))
    fig.update_xaxes(title_text="requests × (1 + k) tokens in the window", type="category")
    for col, key in ((1, "eager"), (2, "CUDA graph")):
        top = max(max(t.y) for t in fig.data if t.xaxis == ("x" if col == 1 else "x2"))
        fig.update_yaxes(title_text=f"µs per window ({key})", range=[0, top * 1.25], row=1, col=col)  # room for labels
    return fig


def _num_layers(result: Mapping) -> int | None:
    m = re.search(r"(\d+)\s+layers", str(result.get("shape", "")))
    return int(m.group(1)) if m else None


def _extra_launches(mode: str, num_layers: int | None) -> int | None:
    """Launches `mode` issues per window beyond `off`'s, as the policies declare them."""
    if num_layers is None:
        return None
    from nwor_lab.viz.costs import launches_per_window
    mine, off = launches_per_window(mode, num_layers), launches_per_window("off", num_layers)
    return None if mine is None or off is None else int(mine - off)


def launch_floor_us(kernels) -> float:
    """GPU time of one small op inside a CUDA graph: the median kernel_us of the ops at the
    smallest token count of the Llama-shaped sweep (write_kv, commit, log, restore: ~2 µs on an H200)."""
    result = load_result(kernels, "kernels")
    rows = [r for r in result["sweeps"] if r["shape"] == result["sweeps"][0]["shape"]]
    smallest = min(r["tokens"] for r in rows)
    times = sorted(r["kernel_us"] for r in rows if r["tokens"] == smallest)
    return times[len(times) // 2]


def policy_overhead(policies, *, kernels=None, live=None,
                    title: str = "What each policy adds to off, under a CUDA graph"):
    """Bars: graphed µs per window minus `off`'s, per mode, by window size. With `kernels`, a
    dashed line per mode at (extra launches it declares) × (one small graphed kernel): what the
    launches alone cost; the bars rise above it as the window's bytes grow."""
    stored, live = _load(policies, live, "policies")
    fig = go.Figure()
    modes = [m for m in _modes(stored["results"][0]) if m not in (BASELINE, "off")]
    for result, suffix, is_live in _sources(stored, live):
        rows = result["results"]
        for i, mode in enumerate(modes):
            if mode not in rows[0]:
                continue
            y = [r[mode]["graph_us"] - r["off"]["graph_us"] for r in rows]
            fig.add_trace(go.Bar(x=[_window_label(r) for r in rows], y=y, name=f"{mode} − off{suffix}",
                                 marker_color=_colour(mode, i + 2), text=[f"{v:+.1f}" for v in y],
                                 textposition="outside",
                                 hovertemplate=f"{mode}: %{{y:+.1f}} µs over off at %{{x}} tokens<extra></extra>",
                                 **_bar_style(is_live)))
    note = None
    if kernels is not None:
        floor, layers = launch_floor_us(kernels), _num_layers(stored)
        labels = [_window_label(r) for r in stored["results"]]
        for i, mode in enumerate(modes):
            n = _extra_launches(mode, layers)
            if n:
                # negative for zero-copy stage: it launches fewer kernels than off (one commit)
                _reference_line(fig, labels, n * floor, f"{mode}: {n:+d} launch{'es' if abs(n) > 1 else ''} × "
                                f"{floor:.1f} µs = {n * floor:+.1f} µs", _colour(mode, i + 2))
        note = f"dashed: the extra launches each policy declares × {floor:.1f} µs (one small kernel in a graph)"
    _layout(fig, title, result_subtitle(stored, note, live=live), height=480)
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text="requests × (1 + k) tokens in the window", type="category")
    fig.update_yaxes(title_text="µs over off per window (graph)")
    return fig


# -- kernels ----------------------------------------------------------------------------------
def _sweep(result: Mapping, op: str | None, shape: str, where: str = "kernels result") -> list[dict]:
    rows = [r for r in result["sweeps"] if r["shape"] == shape and (op is None or r["op"] == op)]
    if not rows:
        have = sorted({(r["shape"], r["op"]) for r in result["sweeps"]})
        raise BenchmarkFileError(f"{where}: no rows for shape={shape!r}" + (f", op={op!r}" if op else "") +
                                 f"; it has {', '.join(f'{s}/{o}' for s, o in have)}")
    return sorted(rows, key=lambda r: r["tokens"])


def _log2_ticks(tokens) -> dict:
    ts = sorted(set(tokens))
    return dict(type="log", tickvals=ts, ticktext=[str(t) for t in ts])


def kernel_time(kernels, *, op: str = "write_kv", shape: str = "llama3-8b", live=None, title: str | None = None):
    """µs per call of `op` against tokens (log-log): eager (host launch included) and inside a
    CUDA graph (GPU time), with the empty custom op's eager and graphed times as floors, and the
    time the op's bytes would take at the device copy bandwidth. Flat lines = launch-bound."""
    stored, live = _load(kernels, live, "kernels")
    fig = go.Figure()
    all_tokens = []
    for result, suffix, is_live in _sources(stored, live):
        rows = _sweep(result, op, shape)
        t = [r["tokens"] for r in rows]
        all_tokens += t
        dash = "dash" if is_live else "solid"
        symbol = "circle-open" if is_live else "circle"
        for key, name, colour in (("us", "eager: host launch included", MODE_COLOURS["off"]),
                                  ("kernel_us", "in a CUDA graph: GPU time", MODE_COLOURS["stage"])):
            fig.add_trace(go.Scatter(x=t, y=[r[key] for r in rows], name=name + suffix, mode="lines+markers",
                                     line=dict(color=colour, dash=dash), marker=dict(symbol=symbol, size=8),
                                     hovertemplate=f"{op}, %{{x}} tokens: %{{y:.2f}} µs ({name})<extra></extra>"))
        if not is_live:
            bw = result["copy_bandwidth_GBps"]
            fig.add_trace(go.Scatter(x=t, y=[r["bytes"] / (bw * 1e3) for r in rows], mode="lines",
                                     name=f"its bytes at the copy bandwidth ({bw / 1e3:.2f} TB/s)",
                                     line=dict(color="#555555", dash="dot"),
                                     hovertemplate="%{x} tokens: %{y:.2f} µs at copy bandwidth<extra></extra>"))
    for key, text, dash in (("empty_op_us", "empty custom op, eager", "dash"),
                            ("empty_op_in_graph_us", "empty custom op in a graph", "dashdot")):
        _reference_line(fig, all_tokens, stored[key], f"{text}: {stored[key]:.2f} µs", "#9a9a9a", dash)
    _layout(fig, title or f"{op}: time per call against tokens ({shape} layer)", result_subtitle(stored, live=live),
            height=520, bottom=150)
    fig.update_xaxes(title_text="tokens written in the call", **_log2_ticks(all_tokens))
    fig.update_yaxes(title_text="µs per call (log)", type="log", dtick=1)
    return fig


def kernel_bandwidth(kernels, *, shape: str = "llama3-8b", ops=None, live=None,
                     title: str = "Achieved bandwidth of each op against tokens"):
    """GB/s each op moves (its bytes over its graphed GPU time) against tokens, log-log, with the
    device copy bandwidth (1 GiB, read + write) and a torch copy of write_kv's bytes at each size
    (the ceiling a kernel that small can reach)."""
    stored, live = _load(kernels, live, "kernels")
    fig = go.Figure()
    all_tokens = []
    for result, suffix, is_live in _sources(stored, live):
        rows = _sweep(result, None, shape)
        names = list(dict.fromkeys(r["op"] for r in rows)) if ops is None else list(ops)
        for i, op in enumerate(names):
            series = [r for r in rows if r["op"] == op]
            all_tokens += [r["tokens"] for r in series]
            fig.add_trace(go.Scatter(
                x=[r["tokens"] for r in series], y=[r["GBps"] for r in series], name=op + suffix,
                mode="lines+markers", line=dict(color=_colour(op, i, OP_COLOURS), dash="dash" if is_live else "solid"),
                marker=dict(symbol="circle-open" if is_live else "circle", size=7),
                hovertemplate=f"{op}, %{{x}} tokens: %{{y:,.0f}} GB/s<extra></extra>"))
        same = [r for r in rows if r["op"] == "write_kv" and "same_size_copy_GBps" in r]
        if same and not is_live:
            fig.add_trace(go.Scatter(x=[r["tokens"] for r in same], y=[r["same_size_copy_GBps"] for r in same],
                                     name="torch copy of write_kv's bytes (in a graph)", mode="lines",
                                     line=dict(color="#555555", dash="dot"),
                                     hovertemplate="%{x} tokens: %{y:,.0f} GB/s (plain copy)<extra></extra>"))
    bw = stored["copy_bandwidth_GBps"]
    _reference_line(fig, all_tokens, bw, f"device copy bandwidth, 1 GiB: {bw / 1e3:.2f} TB/s", "#222222")
    _layout(fig, title, result_subtitle(stored, f"{shape} layer; GB/s = bytes the op must move / its GPU time in a graph",
                                        live=live), height=520, bottom=150)
    fig.update_xaxes(title_text="tokens per call", **_log2_ticks(all_tokens))
    fig.update_yaxes(title_text="achieved GB/s (log)", type="log", dtick=1)
    return fig


def window_commit(kernels, *, live=None, title: str = "Committing a window: one launch for all layers"):
    """Bars: a whole window's commit (all layers, one launch) against one write_kv launch per
    layer, eager and inside a CUDA graph (`window_commit` of the kernels result)."""
    stored, live = _load(kernels, live, "kernels")
    fig = go.Figure()
    w = None
    for result, suffix, is_live in _sources(stored, live):
        where = "live kernels result" if is_live else "kernels result"
        _require(result.get("window_commit"), _WINDOW_COMMIT, f"{where}: 'window_commit'", "kernels")
        w = w or result["window_commit"]
        wc = result["window_commit"]
        x = ["eager (launched from Python)", "in a CUDA graph"]
        for name, keys, colour in (
                (f"{wc['layers']} × write_kv, one launch per layer", ("write_kv_per_layer_32_launches_us",
                                                                       "write_kv_32_launches_in_graph_us"),
                 MODE_COLOURS["off"]),
                ("commit: all layers in one launch", ("commit_one_launch_us", "commit_kernel_us"),
                 MODE_COLOURS["stage"])):
            y = [wc[k] for k in keys]
            fig.add_trace(go.Bar(x=x, y=y, name=name + suffix, marker_color=colour, text=[f"{v:.1f} µs" for v in y],
                                 textposition="outside", hovertemplate="%{x}: %{y:.1f} µs<extra></extra>",
                                 **_bar_style(is_live)))
    extra = (f"{w['layers']} layers × {w['tokens']} window tokens, {w['accepted']} accepted "
             f"(rejected rows are slot -1 for write_kv)")
    _layout(fig, title, result_subtitle(stored, extra, live=live), height=480)
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text="how the launches are issued")
    fig.update_yaxes(title_text="µs per window commit", rangemode="tozero")
    return fig


# -- engine -----------------------------------------------------------------------------------
HF_GENERATE = "Hugging Face generate (greedy)"


def _config_name(row: Mapping) -> str:
    if str(row.get("config", "")).startswith("hf-generate"):
        return HF_GENERATE             # the outside baseline: its own bars, not the lab's target-only
    if not row["k"]:
        return "target-only"
    name = f"EAGLE k={row['k']} · {row.get('nwor', '?')}"
    return name + (f" · SCV {row['scv']}" if row.get("scv") not in (None, "off") else "")


def engine_throughput(engine, *, title: str = "Tokens/s: speculative decoding against target-only"):
    """Grouped bars: tokens/s per configuration (target-only, EAGLE in each write policy and SCV
    mode) by batch size; the speculative bars are labelled with their speed-up over target-only."""
    result = load_result(engine, "engine")
    rows = result["results"]
    fig = go.Figure()
    names = list(dict.fromkeys(_config_name(r) for r in rows))
    batches = list(dict.fromkeys(r["batch_size"] for r in rows))
    for i, name in enumerate(names):
        series = [r for r in rows if _config_name(r) == name]
        mode = series[0].get("nwor") if series[0]["k"] else (BASELINE if name == "target-only" else name)
        scv_on = series[0].get("scv") not in (None, "off")
        speed = [r.get("speedup_vs_target_only") for r in series]
        fig.add_trace(go.Bar(
            x=[f"batch {r['batch_size']}" for r in series], y=[r["tokens_per_s"] for r in series], name=name,
            marker_color=_colour(mode, i), marker_pattern_shape="x" if scv_on else "",
            text=[f"{s:.2f}×" if (s is not None and r["k"]) else f"{r['tokens_per_s']:.0f}"
                  for s, r in zip(speed, series)], textposition="outside", **_bar_style(False, len(names) > 3),
            hovertemplate=f"{name}<br>%{{x}}: %{{y:.0f}} tokens/s<extra></extra>"))
    acc = [r.get("mean_acceptance_length") for r in rows if r["k"] and r.get("mean_acceptance_length")]
    extra = (" · ".join(str(result[k]) for k in ("dtype", "prompts") if result.get(k)) +
             (f"; mean accepted length {min(acc):.2f}–{max(acc):.2f}" if acc else "") +
             "; bar labels: speed-up over target-only (tokens/s on the baselines' bars)")
    _layout(fig, title, result_subtitle(result, extra), height=520,
            legend_y=-0.2, bottom=140)
    fig.update_layout(barmode="group", uniformtext=dict(minsize=10, mode="show"))
    fig.update_xaxes(title_text="batch size (requests decoded together)", type="category")
    top = max(r["tokens_per_s"] for r in rows)
    fig.update_yaxes(title_text="tokens/s (generated, end to end)", range=[0, top * 1.25 if math.isfinite(top) else None])
    return fig


def step_ratio(step, *, model: str = "8b", rate: float = 0.5,
               title: str = "A whole verify step under each write policy, relative to off"):
    """Two panels, one above the other (eager, then one CUDA graph): step time of cow and stage
    divided by off's, from the same run, for every batch x k of `model` at forced acceptance
    `rate` (the x axis groups k under each batch); below 1 = faster than off. Each panel has its
    own y range (the graphed ratios sit within a percent of 1). The KV path's share of off's step
    is in the hover."""
    result = load_result(step, "step")
    rows = [r for r in result["results"] if r["model"] == model and abs(r["rate"] - rate) < 1e-9]
    if not rows:
        raise BenchmarkFileError(f"step result: no rows for model={model!r} at rate={rate}")
    kinds = [k for k in ("eager", "graph") if f"{k}_us" in rows[0]["off"]]
    names = {"eager": "eager (host included)", "graph": "one CUDA graph (GPU time)"}
    fig = make_subplots(rows=len(kinds), cols=1, shared_xaxes=True, vertical_spacing=0.14,
                        subplot_titles=[names[k] for k in kinds])
    x = [[f"batch {r['batch']}" for r in rows], [f"k {r['k']}" for r in rows]]   # two-level categories
    for row, kind in enumerate(kinds, 1):
        for i, mode in enumerate(("cow", "stage")):
            fig.add_trace(go.Bar(
                x=x, y=[r[mode][f"{kind}_vs_off"] for r in rows], name=mode, legendgroup=mode,
                showlegend=row == 1, marker_color=_colour(mode, i),
                customdata=[[r["off"][f"{kind}_us"], r["off"].get(f"{kind}_kv_share", float("nan")) * 100,
                             f"batch {r['batch']} · k {r['k']}"] for r in rows],
                hovertemplate=f"{mode}/off %{{y:.3f}}<br>off %{{customdata[0]:.0f}} µs, KV path "
                              f"%{{customdata[1]:.1f}} % of it<extra>%{{customdata[2]}}</extra>"), row=row, col=1)
        fig.add_hline(y=1.0, line_dash="dash", line_color="#555", row=row, col=1)
        ys = [r[m][f"{kind}_vs_off"] for r in rows for m in ("cow", "stage")]
        pad = max(0.01, 0.15 * (max(ys) - min(ys)))
        fig.update_yaxes(title_text="÷ off's step time", range=[min(min(ys), 1) - pad, max(max(ys), 1) + pad],
                         row=row, col=1)
    _layout(fig, title, result_subtitle(result, f"{model}, forced acceptance {rate:g}, context "
                                                f"{rows[0].get('context', '?')} tokens; dashed line: as fast as off"),
            height=330 * len(kinds) + 140, legend_y=-0.12, bottom=110, subplot_titles=True)
    fig.update_layout(barmode="group")
    return fig
