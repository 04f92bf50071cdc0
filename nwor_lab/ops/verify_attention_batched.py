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

from dataclasses import dataclass

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


def plan_batched(block_tables, cache_lens, query_start_loc, positions, block_size: int, *, win_rows=None,
                 win_start=None) -> BatchedPlan:
    """The layer-independent half of `verify_attention_batched` (see the module doc)."""
    num_reqs = cache_lens.numel()
    dev = positions.device
    qsl = query_start_loc.long()[:num_reqs + 1]
    q_lens = qsl.diff()
    clen = cache_lens.long()
    wlen = win_start.long().diff()[:num_reqs] if win_start is not None else torch.zeros_like(clen)
    n_keys = clen + wlen
    kmax, qmax = int(n_keys.max()), int(q_lens.max())
    p = torch.arange(kmax, device=dev)[None, :]                               # [1, K] key positions
    from_cache = p < clen[:, None]                                             # [R, K]
    col = torch.clamp(p // block_size, max=block_tables.shape[1] - 1).expand(num_reqs, kmax)
    blocks = torch.where(from_cache, block_tables.long().gather(1, col), torch.zeros_like(col))
    rows = from_win = None
    if win_start is not None:
        from_win = ~from_cache & (p < n_keys[:, None])
        idx = torch.where(from_win, win_start.long()[:num_reqs, None] + p - clen[:, None], torch.zeros_like(col))
        rows, from_win = win_rows.long()[idx], from_win[..., None, None]
    j = torch.arange(qmax, device=dev)[None, :]
    real_q = j < q_lens[:, None]                                               # [R, Q]
    tok = torch.where(real_q, qsl[:num_reqs, None] + j, torch.zeros_like(j))
    pos = positions.long()[tok]                                                # [R, Q]
    mask = (p[:, None, :] <= pos[:, :, None]) & (p < n_keys[:, None])[:, None, :]   # [R, Q, K]
    mask |= ~real_q[:, :, None] & (p == 0)[:, None, :]                         # padded rows: key 0 (no NaN)
    return BatchedPlan(blocks, p % block_size, rows, from_win, tok, real_q, mask[:, None], tok[real_q])


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
    groups = hq // key_cache.shape[2]
    if groups > 1:
        keys, values = keys.repeat_interleave(groups, dim=2), values.repeat_interleave(groups, dim=2)
    o = F.scaled_dot_product_attention(q[plan.tok].transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                       attn_mask=plan.mask, scale=scale)      # [R, Hq, Q, D]
    out[plan.out_rows] = o.transpose(1, 2)[plan.real_q]
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
