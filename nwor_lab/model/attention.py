"""Paged attention, torch reference: write the window's K/V, then read the request's keys.

Where the keys come from depends on the write policy (see docs/architecture.md):
  off / cow / no policy  every position 0..seq_len-1 from the paged cache (the window's rows
                         were just written there);
  stage                  the prefix (positions before the window) from the cache, the window
                         from `policy.window_kv(layer)`, rows `window_rows[r]` (causal inside).
`AttentionMetadata.build` fixes both per forward pass, once for all layers.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F




@dataclass
class AttentionMetadata:
    """One forward pass over a flattened variable-length batch of `R` requests, `T` tokens.

    positions      [T] int64   position of each token in its request
    slot_mapping   [T] int64   where its K/V is written (-1: write nothing)
    query_start_loc list[int]  R+1 offsets of each request's rows (vLLM `query_start_loc`)
    read_slots     list[[n_r]] cache slots of positions 0..cache_len_r-1, read from the cache
    window_rows    list[[w_r]] | None   rows of `policy.window_kv(layer)` holding positions
                   cache_len_r .. cache_len_r+w_r-1 (stage); None reads everything from the cache
    masks          list[[q_r, n_r+w_r]] bool, True where a query may attend (key pos <= query pos)
    policy         write policy (begin() already called) or None for a plain `write_kv`
    write_offset   row of this pass's first token inside the policy's window
    """

    positions: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc: list
    read_slots: list
    window_rows: list | None
    masks: list
    cache: object
    policy: object = None
    write_offset: int = 0

    @classmethod
    def build(cls, cache, positions, query_lens, block_tables, cache_lens, slot_mapping=None,
              window_rows=None, policy=None, write_offset: int = 0) -> "AttentionMetadata":
        """positions [T]; query_lens, cache_lens: ints per request; block_tables: lists of block ids.

        A request's keys are positions 0..cache_len-1 (cache) then its window rows; its queries
        are the last `query_len` of those keys. slot_mapping defaults to the block tables'.
        """
        dev = cache.device
        bs = cache.spec.block_size
        positions = torch.as_tensor(positions, dtype=torch.long, device=dev)
        qsl = [0]
        for n in query_lens:
            qsl.append(qsl[-1] + int(n))
        if qsl[-1] != positions.numel():
            raise ValueError(f"positions: {positions.numel()} tokens but query_lens sum to {qsl[-1]}")
        pos_host = positions.tolist()
        read_slots, masks = [], []
        for r, table in enumerate(block_tables):
            n_cache = int(cache_lens[r])
            n_win = 0 if window_rows is None else len(window_rows[r])
            if -(-n_cache // bs) > len(table):
                raise ValueError(f"request {r}: {n_cache} cached positions need "
                                 f"{-(-n_cache // bs)} blocks, its block table has {len(table)}")
            p = torch.arange(n_cache)
            tab = torch.as_tensor(list(table), dtype=torch.long)
            read_slots.append((tab[p // bs] * bs + p % bs).to(dev) if n_cache else
                              torch.empty(0, dtype=torch.long, device=dev))
            qpos = torch.tensor(pos_host[qsl[r]:qsl[r + 1]], dtype=torch.long)
            kpos = torch.arange(n_cache + n_win)
            masks.append((kpos[None, :] <= qpos[:, None]).to(dev))
        if slot_mapping is None:
            slot_mapping = []
            for r, table in enumerate(block_tables):
                for p in pos_host[qsl[r]:qsl[r + 1]]:
                    slot_mapping.append(table[p // bs] * bs + p % bs)
        slot_mapping = torch.as_tensor(slot_mapping, dtype=torch.long, device=dev)
        rows = None
        if window_rows is not None:
            rows = [torch.as_tensor(list(w), dtype=torch.long, device=dev) for w in window_rows]
        return cls(positions, slot_mapping, qsl, read_slots, rows, masks, cache, policy, write_offset)


def write_and_attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     md: AttentionMetadata, scale: float) -> torch.Tensor:
    """q `[T, Hq, D]`, k/v `[T, H, D]` (RoPE applied) -> attention output `[T, Hq, D]`.

    The write goes through the policy (or plain `write_kv`), then each request attends to its
    keys as described in the module docstring. Grouped-query: Hq // H query heads share a KV head.
    """
    cache = md.cache
    if md.policy is not None:
        md.policy.write(layer, k, v, token_offset=md.write_offset)
    else:
        from nwor_lab.ops import write_kv  # lazy: training never touches the paged cache
        ks, vs = cache.layer_scales(layer)
        write_kv(k, v, *cache.layer(layer), md.slot_mapping, ks, vs)
    win_k = win_v = None
    if md.window_rows is not None:
        win = md.policy.window_kv(layer)
        if win is None:
            raise RuntimeError(f"layer {layer}: attention expects a staged window but the "
                               f"policy returned none (window_kv is for mode 'stage')")
        win_k, win_v = win
        if cache.is_fp8:
            # read the window exactly as the cache would hand it back (quantised, then scaled), so
            # stage attends to the same numbers as off / cow
            from nwor_lab.ops.quant import dequantize, quantize
            ks, vs = cache.layer_scales(layer)
            st = cache.spec.storage_dtype
            win_k = dequantize(quantize(win_k, st, ks), q.dtype, ks)
            win_v = dequantize(quantize(win_v, st, vs), q.dtype, vs)
    groups = q.shape[1] // k.shape[1]
    out = torch.empty_like(q)
    for r in range(len(md.read_slots)):
        s, e = md.query_start_loc[r], md.query_start_loc[r + 1]
        if s == e:
            continue
        keys, values = cache.gather(layer, md.read_slots[r])
        if win_k is not None:
            rows = md.window_rows[r]
            keys = torch.cat([keys, win_k[rows].to(keys.dtype)])
            values = torch.cat([values, win_v[rows].to(values.dtype)])
        keys = keys.to(q.dtype).repeat_interleave(groups, dim=1)      # [n, Hq, D]
        values = values.to(q.dtype).repeat_interleave(groups, dim=1)
        o = F.scaled_dot_product_attention(q[s:e].transpose(0, 1), keys.transpose(0, 1),
                                           values.transpose(0, 1), attn_mask=md.masks[r], scale=scale)
        out[s:e] = o.transpose(0, 1)
    return out
