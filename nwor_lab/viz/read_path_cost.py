"""What `stage`'s second key source costs on a GPU, read from stored runs (nothing is measured here).

Two levels, each scoped to what its file measured:
- the verify-attention kernel alone (`nwor_lab.bench.attention`, e.g. benchmarks/results/
  verify_attention_h200.json, the 8B layer: 32 query heads over 8 KV heads of 128, bf16): its
  `window_vs_cache` rows time the same attention twice, the window's keys read from the staging
  buffer (`window_kernel_us`) and the same keys read from the cache (`cache_kernel_us`), CUDA-graph
  replay;
- the whole verify step (`nwor-lab bench step`, e.g. step_8b_onestep_h200.json): stage's step time over
  off's, graphed and eager reported apart (`graph_vs_off`, `eager_vs_off`), since eager steps are
  dominated by the host and vary from run to run.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import plotly.graph_objects as go

from nwor_lab.viz.perf import BenchmarkFileError, load_result
from nwor_lab.viz.theme import base_layout

WINDOW_ROW = ("batch", "context", "q_len", "window_keys", "cache_kernel_us", "window_kernel_us", "ratio")


def load_window_vs_cache(path: str | os.PathLike) -> dict:
    """A verify-attention result (`python -m nwor_lab.bench.attention --json FILE`) with its
    `window_vs_cache` rows checked."""
    where = os.fspath(path)
    try:
        result = json.loads(Path(where).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BenchmarkFileError(f"{where}: no such file; the stored results are in benchmarks/results/") from None
    rows = result.get("window_vs_cache")
    if not isinstance(rows, list) or not rows:
        raise BenchmarkFileError(f"{where}: no 'window_vs_cache' rows (written by "
                                 f"`python -m nwor_lab.bench.attention --json FILE`)")
    for i, row in enumerate(rows):
        missing = [k for k in WINDOW_ROW if k not in row]
        if missing:
            raise BenchmarkFileError(f"{where}: window_vs_cache[{i}] lacks {', '.join(missing)}")
    return result


def window_ratio_range(result: dict) -> tuple[float, float]:
    """(lowest, highest) window / cache kernel-time ratio over the file's rows."""
    r = [row["ratio"] for row in result["window_vs_cache"]]
    return min(r), max(r)


def window_cost_figure(result: dict, *, subtitle_extra: str | None = None) -> go.Figure:
    """Kernel time with the window's keys read from the staging buffer over the same keys read from
    the cache, per batch x context, one bar per query length (1.0: the same time)."""
    rows = result["window_vs_cache"]
    groups = sorted({(r["batch"], r["context"]) for r in rows}, key=lambda g: (-g[0], -g[1]))
    fig = go.Figure()
    palette = ["#5b8fd0", "#e69f00", "#4db58a", "#b98bd6"]
    for i, q_len in enumerate(sorted({r["q_len"] for r in rows})):
        pts = {(r["batch"], r["context"]): r for r in rows if r["q_len"] == q_len}
        xs = [f"batch {b}<br>context {c}" for b, c in groups if (b, c) in pts]
        ys = [pts[g]["ratio"] for g in groups if g in pts]
        keys = pts[next(iter(pts))]["window_keys"]
        fig.add_trace(go.Bar(x=xs, y=ys, name=f"{q_len} query row{'s' if q_len > 1 else ''} a request ({keys} window keys)",
                             marker_color=palette[i % len(palette)], text=[f"{y:.3f}" for y in ys],
                             textposition="outside"))
    fig.add_hline(y=1.0, line=dict(color="#222222", dash="dash"))
    top = max(r["ratio"] for r in rows)
    fig.update_layout(**base_layout("Verify attention: window keys from the staging buffer vs from the cache",
                                    shape_subtitle(result, subtitle_extra)), barmode="group", height=500, width=1100)
    fig.update_yaxes(title="÷ cache-only time", range=[0.9, max(1.15, top + 0.04)])
    return fig


def shape_subtitle(result: dict, extra: str | None = None) -> str:
    """`NVIDIA H200 · bf16, 32 query heads over 8 KV heads of 128, block size 16 · measured 2026-11-23` (+ extra)."""
    sh = result.get("shape") or {}
    parts = [str(result.get("device", "?"))]
    if sh:
        parts.append(f"{sh.get('dtype')}, {sh.get('num_q_heads')} query heads over {sh.get('num_kv_heads')} KV heads of "
                     f"{sh.get('head_size')}, block size {sh.get('block_size')}")
    if result.get("date"):
        parts.append(f"measured {str(result['date'])[:10]}")
    return " · ".join(parts) + (f". {extra}" if extra else "")


def step_rows(path: str | os.PathLike) -> tuple[dict, list[dict]]:
    """A step result's rows as (result, [{batch, k, context, graph_vs_off, eager_vs_off}]) for stage."""
    result = load_result(path, "step")
    out = [dict(batch=r["batch"], k=r["k"], context=r.get("context"), graph_vs_off=r["stage"].get("graph_vs_off"),
                eager_vs_off=r["stage"].get("eager_vs_off")) for r in result["results"]]
    return result, out
