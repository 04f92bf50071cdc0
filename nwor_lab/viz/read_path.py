"""The GPU read path of `stage`, modelled in torch on the CPU: how verify attention reads one
request's keys from two sources (the paged cache and the staging buffer) tile by tile, and how
partial softmax states over key ranges merge exactly.

What the model mirrors (`nwor_lab.ops._verify_attention_triton`, its module docstring):
- key tiles are `block_n` positions long and aligned to position 0; the tiles wholly below
  `cache_len` are the kernel's main loop (cache only); the tile(s) from there on are the tail,
  where position p < cache_len comes from the cache and p >= cache_len from window row
  `p - cache_len` (a pointer select per key);
- softmax runs online over the tiles: a running max m, sum l and accumulator acc per query row;
- the key range is cut into splits (`keys_per_split`, a multiple of `block_n`; the last split runs to
  the end, so it holds the window); each split leaves its normalised output o_s and log-sum-exp
  lse_s, and the merge takes out = sum_s exp(lse_s - LSE) o_s with LSE = logsumexp_s lse_s.

What it does not mirror: base-2 exponentials, GQA query tiles, fp8 round trips and the kernel's
launch plan (how many splits a shape gets); those are the kernel's, checked against the torch
reference by tests/verify_attention_interp.py and tests/gpu/. This model is checked against the lab's
reference (`ops.verify_attention_reference`) by tests/test_viz_read_path.py.

Shapes: q `[Q, D]` (one query head: the request's window rows), cache_k/cache_v `[C, D]` (the
request's cached positions 0..C-1 in order), win_k/win_v `[W, D]` (positions C..C+W-1), positions `[Q]`.
"""
from __future__ import annotations

import math

import plotly.graph_objects as go
import torch

from nwor_lab.viz.states import SlotState
from nwor_lab.viz.theme import STATE_COLOURS, base_layout, discrete_colorscale

CACHE, WINDOW = 0, 1
SOURCE_NAMES = {CACHE: "read from the paged cache (committed K/V)", WINDOW: "read from the staging buffer (this window)"}
SOURCE_COLOURS = {CACHE: STATE_COLOURS[SlotState.COMMITTED], WINDOW: STATE_COLOURS[SlotState.STAGED]}


def key_plan(cache_len: int, window_len: int, block_n: int = 64, keys_per_split: int | None = None) -> dict:
    """Where each of a request's keys comes from, in the kernel's order.

    -> {"source": [n] (CACHE / WINDOW), "tiles": [{"tile", "lo", "hi", "cache", "window", "loop", "split"}],
        "splits": [(lo, hi)]}: loop is "main" (wholly in the cache) or "tail" (the key loop's second part).
    """
    for name, v in (("cache_len", cache_len), ("window_len", window_len)):
        if v < 0:
            raise ValueError(f"{name}={v}: must be >= 0")
    if block_n < 1:
        raise ValueError(f"block_n={block_n}: must be >= 1")
    n = cache_len + window_len
    splits = _splits(n, block_n, keys_per_split)
    tiles = []
    for s, (lo, hi) in enumerate(splits):
        for start in range(lo, hi, block_n):
            end = min(start + block_n, hi)
            in_cache = max(0, min(end, cache_len) - start)
            tiles.append(dict(tile=start // block_n, lo=start, hi=end, cache=in_cache, window=end - start - in_cache,
                              loop="main" if start + block_n <= cache_len else "tail", split=s))
    source = [CACHE if p < cache_len else WINDOW for p in range(n)]
    return dict(source=source, tiles=tiles, splits=splits, cache_len=cache_len, window_len=window_len,
                block_n=block_n)


def _splits(n: int, block_n: int, keys_per_split: int | None) -> list[tuple[int, int]]:
    if keys_per_split is None or keys_per_split >= n:
        return [(0, n)]
    if keys_per_split < block_n or keys_per_split % block_n:
        raise ValueError(f"keys_per_split={keys_per_split}: must be a multiple of block_n={block_n} (tiles stay "
                         f"aligned to position 0)")
    bounds = list(range(0, n, keys_per_split))
    out = [(lo, lo + keys_per_split) for lo in bounds[:-1]]
    return out + [(bounds[-1], n)]        # the last split runs to the end: the window is in it


def two_source_attention(q, cache_k, cache_v, win_k, win_v, positions, *, scale: float, block_n: int = 64,
                         keys_per_split: int | None = None) -> tuple[torch.Tensor, list[dict]]:
    """Attention of q over the keys 0..C+W-1 read from two sources, tile by tile with an online
    softmax per split, the splits merged by log-sum-exp (module doc). Key p is visible to query t iff
    p <= positions[t]. -> (out [Q, D] float32, the splits' partial states [{"lo", "hi", "o" [Q, D],
    "lse" [Q], "tile_max" [tiles, Q]}])."""
    C, W = cache_k.shape[0], win_k.shape[0]
    q = q.float()
    pos = positions.long()
    parts = []
    for lo, hi in key_plan(C, W, block_n, keys_per_split)["splits"]:
        m = torch.full((q.shape[0],), -math.inf)
        l_sum = torch.zeros(q.shape[0])
        acc = torch.zeros(q.shape[0], q.shape[1])
        maxes = []
        for start in range(lo, hi, block_n):
            p = torch.arange(start, min(start + block_n, hi))
            from_cache = p < C
            # the tail tile's pointer select: a cache row below C, a staging-buffer row from C on
            k = torch.where(from_cache[:, None], cache_k[p.clamp(max=max(C - 1, 0))].float() if C else 0.0,
                            win_k[(p - C).clamp(min=0, max=max(W - 1, 0))].float() if W else 0.0)
            v = torch.where(from_cache[:, None], cache_v[p.clamp(max=max(C - 1, 0))].float() if C else 0.0,
                            win_v[(p - C).clamp(min=0, max=max(W - 1, 0))].float() if W else 0.0)
            s = (q @ k.T) * scale
            s = torch.where(p[None, :] <= pos[:, None], s, -math.inf)
            m_new = torch.maximum(m, s.max(dim=1).values)
            safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            alpha = torch.exp(m - safe)                      # rescale what the earlier tiles summed
            e = torch.exp(s - safe[:, None])
            l_sum = l_sum * alpha + e.sum(dim=1)
            acc = acc * alpha[:, None] + e @ v
            m = m_new
            maxes.append(m.clone())
        empty = l_sum == 0                                   # a split no query sees: weight 0 in the merge
        o = torch.where(empty[:, None], torch.zeros_like(acc), acc / torch.where(empty, 1.0, l_sum)[:, None])
        lse = torch.where(empty, torch.full_like(m, -math.inf), m + torch.log(torch.where(empty, 1.0, l_sum)))
        parts.append(dict(lo=lo, hi=hi, o=o, lse=lse, tile_max=torch.stack(maxes)))
    return merge_partials(parts), parts


def merge_partials(parts: list[dict]) -> torch.Tensor:
    """out = sum_s exp(lse_s - LSE) o_s, LSE = logsumexp_s lse_s: the softmax over all keys from the
    splits' normalised outputs (exact up to float rounding: each weight is the split's share of the mass)."""
    lse = torch.stack([p["lse"] for p in parts])            # [S, Q]
    total = torch.logsumexp(lse, dim=0)
    w = torch.exp(lse - total)
    return sum(w[s][:, None] * parts[s]["o"] for s in range(len(parts)))


def split_weights(parts: list[dict], row: int) -> list[float]:
    """Each split's share of query row `row`'s softmax mass (sums to 1)."""
    lse = torch.stack([p["lse"][row] for p in parts])
    return torch.exp(lse - torch.logsumexp(lse, 0)).tolist()


def request_sources(case, r: int, head: int = 0, q_head: int = 0) -> dict:
    """One request of a `VerifyAttentionCase` with a window source (stage) as this model's inputs:
    its query rows for `q_head`, its cached K/V gathered through the block table, its window rows."""
    bs = case.key_cache.shape[1]
    C = int(case.cache_lens[r])
    p = torch.arange(C)
    blk = case.block_tables[r].long()[p // bs]
    lo, hi = int(case.win_start[r]), int(case.win_start[r + 1])
    rows = case.win_rows[lo:hi].long()
    q0, q1 = int(case.query_start_loc[r]), int(case.query_start_loc[r + 1])
    return dict(q=case.q[q0:q1, q_head], cache_k=case.key_cache[blk, p % bs, head], cache_v=case.value_cache[blk, p % bs, head],
                win_k=case.win_key[rows, head], win_v=case.win_value[rows, head], positions=case.positions[q0:q1])


def key_loop_figure(plans: list[dict], labels: list[str], *, subtitle: str | None = None) -> go.Figure:
    """One row per request: every key position coloured by its source, the key tiles outlined and
    named by the loop that reads them, split boundaries dashed."""
    n = max(len(p["source"]) for p in plans)
    z = [[p["source"][i] if i < len(p["source"]) else None for i in range(n)] for p in plans]
    fig = go.Figure(go.Heatmap(z=z, x=list(range(n)), y=labels, zmin=-0.5, zmax=1.5, showscale=False, xgap=0, ygap=70,
                               colorscale=discrete_colorscale([SOURCE_COLOURS[CACHE], SOURCE_COLOURS[WINDOW]]),
                               hovertemplate="key position %{x}<extra></extra>"))
    for y, p in enumerate(plans):
        for t in p["tiles"]:
            fig.add_shape(type="rect", x0=t["lo"] - 0.5, x1=t["hi"] - 0.5, y0=y - 0.3, y1=y + 0.3,
                          line=dict(color="#222222", width=2))
            both = t["cache"] and t["window"]
            text = f"tile {t['tile']}: {t['loop']} loop" + (f"<br>{t['cache']} cache + {t['window']} window" if both
                                                            else f"<br>{t['cache'] or t['window']} keys")
            # above the row (the y axis runs top down), so a narrow tail tile's label does not sit on its keys
            fig.add_annotation(x=(t["lo"] + t["hi"] - 1) / 2, y=y - 0.32, text=text, showarrow=False, yanchor="bottom",
                               font=dict(size=12))
        for lo, _ in p["splits"][1:]:
            fig.add_shape(type="line", x0=lo - 0.5, x1=lo - 0.5, y0=y - 0.3, y1=y + 0.3,
                          line=dict(color="#c00000", width=3, dash="dash"))
    for code, name in SOURCE_NAMES.items():
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name,
                                 marker=dict(symbol="square", size=14, color=SOURCE_COLOURS[code])))
    if any(len(p["splits"]) > 1 for p in plans):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name="split boundary (partials merged after)",
                                 line=dict(color="#c00000", width=3, dash="dash")))
    fig.update_layout(**base_layout("Each request's keys in the verify kernel's key loop", subtitle),
                      height=230 + 150 * len(plans), width=1200)
    fig.update_xaxes(title="key position (tiles aligned to position 0)", showgrid=False)
    fig.update_yaxes(showgrid=False, range=[len(plans) - 0.5, -1.05])
    return fig


def merge_figure(parts: list[dict], row: int, *, subtitle: str | None = None) -> go.Figure:
    """One query row: each split's share of the softmax mass, exp(lse_s - LSE), the weight its
    normalised output gets in the merge."""
    w = split_weights(parts, row)
    names = [f"split {s}: keys {p['lo']}..{p['hi'] - 1}" for s, p in enumerate(parts)]
    fig = go.Figure(go.Bar(x=names, y=w, marker_color="#5b8fd0", text=[f"{x:.3f}" for x in w], textposition="outside",
                           showlegend=False))
    fig.update_layout(**base_layout("The merge: each split's share of one query's softmax mass", subtitle),
                      height=420, width=900)
    fig.update_yaxes(title="weight exp(lse_s − LSE)", range=[0, 1.15])
    return fig
