"""verify_attention_batched: the reference's semantics with every request at once (torch, CPU).

`verify_attention_reference` walks the requests one by one (a gather, a concat and an SDPA each):
obviously right, and on a CPU its per-request overhead is what a verify step pays, about 0.2 ms a
request and layer. This version does the same arithmetic as ONE gather and ONE masked SDPA over
the requests padded to the longest query and key range:

    key position p of request r (p < cache_lens[r] + w_r, w_r its window rows)
        p <  cache_lens[r]:  key_cache[block_tables[r, p // BS], p % BS]
        p >= cache_lens[r]:  win_key[win_rows[win_start[r] + p - cache_lens[r]]]
    query t of request r sees key p iff p <= positions[t] (and p is one of r's keys)

Same arguments as `verify_attention_reference`, without fp8 caches (the vLLM plugin's caches are
in the model dtype). Padded key and query positions are masked out and never reach `out`; the
result equals the reference's up to the order of floating-point sums (tests/test_verify_attention_batched.py).
The nwor_lab.vllm plugin's `stage` attention runs it on every layer of every verify step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from nwor_lab.kv.cache import is_fp8


@dataclass
class BatchedPlan:
    """Everything about one pass that does not depend on the layer: which cache slot or window row
    each padded key position reads, and the mask. Built once per pass, used by every layer."""
    blocks: torch.Tensor          # [R, K] block id of key position p (0 where p is not from the cache)
    offsets: torch.Tensor         # [1, K] p % block_size
    win_rows: torch.Tensor | None  # [R, K] window row of key position p (0 where p is not from the window)
    from_win: torch.Tensor | None  # [R, K, 1, 1] bool
    tok: torch.Tensor             # [R, Q] query row of (request, j) (0 for padding)
    real_q: torch.Tensor          # [R, Q] bool
    mask: torch.Tensor            # [R, 1, Q, K] bool: query may see key
    out_rows: torch.Tensor        # [sum q_len] query rows in (request, j) order
    _masks: dict = field(default_factory=dict)   # GQA group size -> the mask repeated along the group

    def mask_for(self, groups: int) -> torch.Tensor:
        """`[R, 1, G*Q, K]`: the mask of each query row, once per head of its KV group (made once)."""
        if groups not in self._masks:
            self._masks[groups] = self.mask if groups == 1 else self.mask.repeat(1, 1, groups, 1)
        return self._masks[groups]


def plan_batched(block_tables, cache_lens, query_start_loc, positions, block_size: int, *, win_rows=None,
                 win_start=None) -> BatchedPlan:
    """The layer-independent half of `verify_attention_batched` (see the module doc). CPU tensors:
    the index arithmetic runs in numpy (a few microseconds an op; torch's dispatch costs more than
    the arithmetic at these sizes) on zero-copy views, and comes back as torch tensors."""
    if positions.device.type != "cpu":
        raise ValueError(f"positions: on {positions.device}; verify_attention_batched runs CPU tensors (on a GPU "
                         f"use verify_attention's Triton kernel)")
    num_reqs = cache_lens.numel()
    qsl = query_start_loc.numpy().astype(np.int64)[:num_reqs + 1]
    q_lens = np.diff(qsl)
    clen = cache_lens.numpy().astype(np.int64)
    wlen = np.diff(win_start.numpy().astype(np.int64))[:num_reqs] if win_start is not None else np.zeros_like(clen)
    n_keys = clen + wlen
    kmax, qmax = int(n_keys.max()), int(q_lens.max())
    p = np.arange(kmax)[None, :]                                               # [1, K] key positions
    from_cache = p < clen[:, None]                                             # [R, K]
    tables = block_tables.numpy()
    col = np.minimum(p // block_size, tables.shape[1] - 1)
    blocks = np.where(from_cache, np.take_along_axis(tables, np.broadcast_to(col, (num_reqs, kmax)), 1), 0)
    rows = from_win = None
    if win_start is not None:
        from_win = ~from_cache & (p < n_keys[:, None])
        idx = np.where(from_win, win_start.numpy().astype(np.int64)[:num_reqs, None] + p - clen[:, None], 0)
        rows = torch.from_numpy(win_rows.numpy().astype(np.int64)[idx])
        from_win = torch.from_numpy(from_win[..., None, None])
    j = np.arange(qmax)[None, :]
    real_q = j < q_lens[:, None]                                               # [R, Q]
    tok = np.where(real_q, qsl[:num_reqs, None] + j, 0)
    pos = positions.numpy().astype(np.int64)[tok]                              # [R, Q]
    mask = (p[:, None, :] <= pos[:, :, None]) & (p < n_keys[:, None])[:, None, :]   # [R, Q, K]
    mask |= ~real_q[:, :, None] & (p == 0)[:, None, :]                         # padded rows: key 0 (no NaN)
    return BatchedPlan(torch.from_numpy(np.ascontiguousarray(blocks)), torch.from_numpy(p % block_size), rows,
                       from_win, torch.from_numpy(tok), torch.from_numpy(real_q), torch.from_numpy(mask[:, None]),
                       torch.from_numpy(tok[real_q]))


def attend_batched(plan: BatchedPlan, q, key_cache, value_cache, *, win_key=None, win_value=None, scale,
                   out=None):
    """The layer-dependent half: gather this layer's keys by `plan`, one masked SDPA, rows to `out`."""
    if is_fp8(key_cache.dtype):
        raise ValueError("key_cache: fp8 caches go through verify_attention_reference (dequantisation per read)")
    t, hq, d = q.shape
    if out is None:
        out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    if t == 0 or plan.tok.numel() == 0:
        return out
    keys = key_cache[plan.blocks, plan.offsets].to(q.dtype)                   # [R, K, H, D]
    values = value_cache[plan.blocks, plan.offsets].to(q.dtype)
    if plan.win_rows is not None:
        keys = torch.where(plan.from_win, win_key[plan.win_rows].to(q.dtype), keys)
        values = torch.where(plan.from_win, win_value[plan.win_rows].to(q.dtype), values)
    r, h = plan.tok.shape[0], key_cache.shape[2]
    groups, qmax = hq // h, plan.tok.shape[1]
    # GQA without copying K/V: query head j*G+g reads KV head j, so the G heads of a group ride as
    # G*Q query rows of one head ([R, H, G*Q, D]) and the mask repeats along them
    qg = q[plan.tok].view(r, qmax, h, groups, d).permute(0, 2, 3, 1, 4).reshape(r, h, groups * qmax, d)
    o = F.scaled_dot_product_attention(qg, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=plan.mask_for(groups),
                                       scale=scale)                             # [R, H, G*Q, D]
    o = o.view(r, h, groups, qmax, d).permute(0, 3, 1, 2, 4).reshape(r, qmax, hq, d)
    out[plan.out_rows] = o[plan.real_q]
    return out


def verify_attention_batched(q, key_cache, value_cache, block_tables, cache_lens, query_start_loc, positions, *,
                             win_key=None, win_value=None, win_rows=None, win_start=None, scale, out=None):
    """q `[T, Hq, D]`, caches `[NB, BS, H, D]` (any layout), block_tables `[R, maxb]`, cache_lens
    `[R]`, query_start_loc `[R+1]`, positions `[T]`; window rows as in the reference -> `[T, Hq, D]`."""
    if q.shape[0] == 0 or cache_lens.numel() == 0:
        return out if out is not None else torch.empty_like(q)
    plan = plan_batched(block_tables, cache_lens, query_start_loc, positions, key_cache.shape[1],
                        win_rows=win_rows, win_start=win_start)
    return attend_batched(plan, q, key_cache, value_cache, win_key=win_key, win_value=win_value, scale=scale, out=out)
