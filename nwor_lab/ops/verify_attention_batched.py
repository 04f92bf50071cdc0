"""verify_attention_batched: the reference's semantics with every request at once (torch, CPU).

`verify_attention_reference` walks the requests one by one (a gather, a concat and an SDPA each):
obviously right, and on a CPU its per-request overhead is what a verify step pays, about 0.2 ms a
request and layer. This version does the same arithmetic with a handful of ops for all requests:

    request r's keys, in order: its cache positions 0 .. cache_lens[r]-1, then its window rows
        cache part:  the WHOLE blocks block_tables[r, 0 .. nb-1] (nb = the most blocks any request
                     reads), one gather of [R, nb, BS, H, D]; positions past cache_lens[r] are masked
        window part: win_key[win_rows[win_start[r] + j]], j < the request's window rows (padded, masked)
    query t of request r sees key position p iff p <= positions[t] (and p is one of r's keys)

Gathering whole blocks reads each block as one local run whatever the cache's layout (vLLM's CPU
keys are transposed: gathering single slots reads each key element from another cache line),
and the cache part and the window part are concatenated rather than merged element by element.
Same arguments as `verify_attention_reference`, without fp8 caches (the vLLM plugin's caches are
in the model dtype). Padded keys and queries are masked and never reach `out`; the result equals
the reference's up to the order of floating-point sums (tests/test_verify_attention_batched.py).
The index work does not depend on the layer: `plan_batched` does it once per pass (in numpy: at
these sizes torch's per-op dispatch costs more than the arithmetic) and `attend_batched` runs per
layer (the nwor_lab.vllm plugin's `stage` attention, every layer of every verify step).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from nwor_lab.kv.cache import is_fp8


@dataclass
class BatchedPlan:
    """Everything about one pass that does not depend on the layer, built once and used by every
    layer: the blocks each request reads, its window rows, its query rows, and the mask."""
    blocks: torch.Tensor            # [R, nb] block ids (0 past a request's table: masked)
    win_rows: torch.Tensor | None   # [R, W] window rows (0 past a request's rows: masked)
    tok: torch.Tensor               # [R, Q] query row of (request, j) (0 for padding)
    real_q: torch.Tensor            # [R, Q] bool
    mask: torch.Tensor              # [R, 1, Q, nb*BS + W] bool: query may see key
    out_rows: torch.Tensor          # [sum q_len] query rows in (request, j) order
    _masks: dict = field(default_factory=dict)   # GQA group size -> the mask repeated along the group

    def mask_for(self, groups: int) -> torch.Tensor:
        """`[R, 1, G*Q, K]`: the mask of each query row, once per head of its KV group (made once)."""
        if groups not in self._masks:
            self._masks[groups] = self.mask if groups == 1 else self.mask.repeat(1, 1, groups, 1)
        return self._masks[groups]


def plan_batched(block_tables, cache_lens, query_start_loc, positions, block_size: int, *, win_rows=None,
                 win_start=None) -> BatchedPlan:
    """The layer-independent half of `verify_attention_batched` (see the module doc); CPU tensors."""
    if positions.device.type != "cpu":
        raise ValueError(f"positions: on {positions.device}; verify_attention_batched runs CPU tensors (on a GPU "
                         f"use verify_attention's Triton kernel)")
    num_reqs = cache_lens.numel()
    qsl = query_start_loc.numpy().astype(np.int64)[:num_reqs + 1]
    q_lens = np.diff(qsl)
    clen = cache_lens.numpy().astype(np.int64)
    wlen = np.diff(win_start.numpy().astype(np.int64))[:num_reqs] if win_start is not None else np.zeros_like(clen)
    nb = max(1, int(-(-clen.max() // block_size)))
    tables = block_tables.numpy()[:num_reqs, :nb]
    if tables.shape[1] < nb:                    # a shorter table: validated callers never read past it
        tables = np.pad(tables, ((0, 0), (0, nb - tables.shape[1])))
    used = np.arange(nb)[None, :] < -(-clen[:, None] // block_size)          # blocks holding cache positions
    blocks = np.where(used, tables, 0)                                         # unused: block 0, masked
    wmax = int(wlen.max()) if win_start is not None else 0
    rows = None
    if win_start is not None:
        j = np.arange(wmax)[None, :]
        idx = np.where(j < wlen[:, None], win_start.numpy().astype(np.int64)[:num_reqs, None] + j, 0)
        rows = torch.from_numpy(win_rows.numpy().astype(np.int64)[idx]) if wmax else \
            torch.zeros((num_reqs, 0), dtype=torch.int64)
    # key positions: the cache part's p (valid below cache_lens), then the window part's cache_lens + j
    pc = np.arange(nb * block_size)[None, :]
    key_pos = np.concatenate([np.broadcast_to(pc, (num_reqs, pc.shape[1])), clen[:, None] + np.arange(wmax)[None]], 1)
    key_ok = np.concatenate([pc < clen[:, None], np.arange(wmax)[None, :] < wlen[:, None]], 1)   # [R, K]
    qmax = int(q_lens.max())
    jq = np.arange(qmax)[None, :]
    real_q = jq < q_lens[:, None]                                               # [R, Q]
    tok = np.where(real_q, qsl[:num_reqs, None] + jq, 0)
    pos = positions.numpy().astype(np.int64)[tok]                              # [R, Q]
    mask = (key_pos[:, None, :] <= pos[:, :, None]) & key_ok[:, None, :]        # [R, Q, K]
    mask[:, :, 0] |= ~real_q                                                   # padded rows see one key (no NaN)
    return BatchedPlan(torch.from_numpy(np.ascontiguousarray(blocks)), rows, torch.from_numpy(tok),
                       torch.from_numpy(real_q), torch.from_numpy(mask[:, None]), torch.from_numpy(tok[real_q]))


def attend_batched(plan: BatchedPlan, q, key_cache, value_cache, *, win_key=None, win_value=None, scale,
                   out=None):
    """The layer-dependent half: this layer's blocks and window rows by `plan`, one masked SDPA."""
    if is_fp8(key_cache.dtype):
        raise ValueError("key_cache: fp8 caches go through verify_attention_reference (dequantisation per read)")
    t, hq, d = q.shape
    if out is None:
        out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    if t == 0 or plan.tok.numel() == 0:
        return out
    r, nb = plan.blocks.shape
    bs, h = key_cache.shape[1], key_cache.shape[2]
    keys = key_cache[plan.blocks].reshape(r, nb * bs, h, d)                   # [R, nb*BS, H, D]
    values = value_cache[plan.blocks].reshape(r, nb * bs, h, d)
    if plan.win_rows is not None and plan.win_rows.shape[1]:
        keys = torch.cat([keys, win_key[plan.win_rows].to(keys.dtype)], 1)    # + [R, W, H, D]
        values = torch.cat([values, win_value[plan.win_rows].to(values.dtype)], 1)
    groups, qmax = hq // h, plan.tok.shape[1]
    # GQA without copying K/V: query head j*G+g reads KV head j, so the G heads of a group ride as
    # G*Q query rows of one head ([R, H, G*Q, D]) and the mask repeats along them
    qg = q[plan.tok].view(r, qmax, h, groups, d).permute(0, 2, 3, 1, 4).reshape(r, h, groups * qmax, d)
    o = F.scaled_dot_product_attention(qg, keys.transpose(1, 2).to(q.dtype), values.transpose(1, 2).to(q.dtype),
                                       attn_mask=plan.mask_for(groups), scale=scale)   # [R, H, G*Q, D]
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
