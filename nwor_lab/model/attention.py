"""Paged attention, torch reference: write the pass's K/V through a `KVWriter`, then read keys.

Where a request's keys come from is what the writer declares (nwor_lab.model.writer):
  positions before the window          always from the paged cache;
  the window's own positions           from the cache (where `write` just put them), or, when
                                       `writer.window_in_buffer`, from `writer.window_kv(layer)`,
                                       rows `window_rows[r]` (causal inside the window).
`AttentionMetadata.build` fixes both per forward pass, once for all layers.

With a sliding window (`sliding`, nwor_lab.kv.ring.SlidingWindow) a query at q attends q - W + 1 .. q:
each request reads the cache from its first query's q - W + 1 on (through the ring when the cache
is one). On a ring, a writer that declares `evicted_in_log` (cow) has saved what its drafts'
writes evict; those positions are read from `writer.log_kv(layer)` instead of the overwritten slots.

Two implementations read the same metadata (`attention` in `build`, `LabConfig.attention`):
  torch    the reference below: per request, gather its keys, one masked SDPA (lists of masks)
  triton   `nwor_lab.ops.verify_attention`: one launch per layer for the whole batch, keys read
           through the block tables, the window from the cache or the staging buffer
           (`kernel` holds its tensors: block tables, cached lengths, window rows)
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch
import torch.nn.functional as F

from nwor_lab.kv.blocks import block_table_tensor, build_slot_mapping
from nwor_lab.kv.ring import SlidingWindow
from nwor_lab.model.writer import DirectWriter, KVWriter


@dataclass
class AttentionMetadata:
    """One forward pass over a flattened variable-length batch of `R` requests, `T` tokens.

    positions       [T] int64   position of each token in its request
    slot_mapping    [T] int64   where its K/V belongs in the cache (-1: nowhere)
    query_start_loc list[int]   R+1 offsets of each request's rows (vLLM `query_start_loc`)
    read_slots      list[[n_r]] cache slots of the positions read from the cache
    window_rows     list[[w_r]] | None   rows of `writer.window_kv(layer)` holding the request's
                    window positions after the cached ones (None: everything from the cache)
    masks           list[[q_r, n_r + w_r]] bool, True where a query may attend (key pos <= query
                    pos, and > query pos - W with a sliding window)
    writer          the KVWriter this pass writes through (a write policy with an open window,
                    or a DirectWriter)
    write_offset    row of this pass's first token inside the writer's window
    read_from       list[int]   the first position each request reads from the cache (0 without
                    a sliding window); its keys are positions read_from[r] .. cache_ends[r] - 1,
                    then its window rows
    cache_ends      list[int]   one past the last position each request reads from the cache
    log_ranges      list[(first position, first log row, count)] | None: positions read from
                    `writer.log_kv(layer)` instead of the cache (cow on a ring)
    sliding         the SlidingWindow, or None
    ledger          a RingLedger checking every cache read (debug mode), or None
    states          the state policy (nwor_lab.state) with this pass's window open, for a hybrid
                    target's linear-attention layers (None: the target has none); set by the caller
    tree_mask       [T, words] int64 | None: a pass over tree windows (nwor_lab.tree): request r's
                    window rows (key index context_lens[r] + j) are visible to a query iff bit j of its
                    row is set (its ancestors and itself); tree_lo [R] holds context_lens
    """

    positions: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc: list
    read_slots: list
    window_rows: list | None
    masks: list | None
    cache: object
    writer: KVWriter
    write_offset: int = 0
    kernel: "KernelArgs | None" = None
    read_from: list | None = None
    cache_ends: list | None = None
    log_ranges: list | None = None
    sliding: SlidingWindow | None = None
    ledger: object = None
    states: object = None
    tree_mask: torch.Tensor | None = None
    tree_lo: list | None = None

    @classmethod
    def build(cls, cache, writer: KVWriter | None, positions, query_lens, block_tables, context_lens, *,
              window_rows=None, write_offset: int = 0, slot_mapping=None, attention: str = "auto",
              sliding: SlidingWindow | None = None, num_drafts=None, ledger=None,
              tree_mask: torch.Tensor | None = None) -> "AttentionMetadata":
        """positions [T]; query_lens, context_lens: ints per request; block_tables: block-id lists.

        context_lens[r]: positions of request r committed before the window (always read from
        the cache). window_rows[r]: the window's rows holding request r's tokens so far, this
        pass's included (default: this pass's rows, `write_offset + query_start_loc[r] ..`).
        writer None: a DirectWriter writing to `slot_mapping` (default: from the block tables).
        sliding: the sliding window and ring (None: whole context, linear cache).
        num_drafts[r]: drafts among request r's rows (its last ones), for a pass over a whole
        verify window: with a ring and a writer that declares `evicted_in_log`, the positions their
        writes evict are read from the log. ledger: checks every cache read (debug mode).
        tree_mask [T, words] int64: a pass over tree windows (`TreeWindow.ancestors`; or a chunk of
        one, the EAGLE tree drafter's): bit j of a query's row = the request's window row j (key
        index context_lens[r] + j) is an ancestor or itself; positions are depths; for a whole window
        the default slot_mapping writes row j at position context_lens[r] + j (write-all order).
        """
        dev = cache.device
        bs = cache.spec.block_size
        ring = sliding.ring_slots if sliding is not None else None
        # the host copy, from the caller's list (a device tensor's copy syncs: made only when needed)
        on_host = not torch.is_tensor(positions) or positions.device.type == "cpu"
        pos_host = torch.as_tensor(positions, dtype=torch.long) if on_host else None
        positions = torch.as_tensor(positions, dtype=torch.long, device=dev)
        triton = use_kernel(attention, dev)
        if pos_host is None and (sliding is not None or not triton):
            pos_host = positions.cpu()
        qlens = torch.as_tensor([int(n) for n in query_lens], dtype=torch.long)
        qsl = [0] + qlens.cumsum(0).tolist()
        if qsl[-1] != positions.numel():
            raise ValueError(f"positions: {positions.numel()} tokens but query_lens sum to {qsl[-1]}")
        num_reqs = len(qlens)
        if window_rows is None:
            window_rows = [range(write_offset + qsl[r], write_offset + qsl[r + 1]) for r in range(num_reqs)]
        tables = block_table_tensor(block_tables, dev)
        # on the host: a device repeat_interleave without output_size syncs to learn its length
        token_req = torch.repeat_interleave(torch.arange(num_reqs), qlens).to(dev)
        tree_lo = None
        if tree_mask is not None:
            if ring is not None:
                raise ValueError("tree_mask: a tree window on a ring cache is not supported (N nodes evict N "
                                 "positions, and write-all rows are not in position order); use kv_ring='full'")
            if tuple(tree_mask.shape[:1]) != (positions.numel(),):
                raise ValueError(f"tree_mask: expected [num_tokens={positions.numel()}, words] (one row per "
                                 f"query of this pass), got {tuple(tree_mask.shape)}")
            if write_offset and slot_mapping is None:
                raise ValueError("tree_mask: a pass over part of a tree window (write_offset > 0) needs its "
                                 "slot_mapping (the rows' write-all slots)")
            tree_lo = [int(c) for c in context_lens]
            if slot_mapping is None:      # write-all: row j at position n + j (positions are depths)
                rows = torch.arange(positions.numel()) - torch.repeat_interleave(torch.tensor(qsl[:-1]), qlens)
                write_pos = torch.repeat_interleave(torch.tensor(tree_lo, dtype=torch.long), qlens) + rows
                slot_mapping = build_slot_mapping(tables, token_req, write_pos.to(dev), bs, ring)
        if slot_mapping is None:
            slot_mapping = build_slot_mapping(tables, token_req, positions, bs, ring)
        slot_mapping = torch.as_tensor(slot_mapping, dtype=torch.long, device=dev)
        if writer is None:
            writer = DirectWriter(cache, slot_mapping)
        in_buffer = writer.window_in_buffer
        n_win = [len(w) for w in window_rows]
        n_cache = [int(c) + (0 if in_buffer else w) for c, w in zip(context_lens, n_win)]
        for r, table in enumerate(block_tables):
            held = n_cache[r] if ring is None else min(n_cache[r], ring)
            if -(-held // bs) > len(table):
                raise ValueError(f"request {r}: {held} cached positions need {-(-held // bs)} "
                                 f"blocks, its block table has {len(table)}")
        # each request reads the cache from its first (lowest) query's window on
        read_from = [0] * num_reqs if sliding is None else \
            [min(n_cache[r], sliding.first_key(int(pos_host[qsl[r]]))) if qlens[r] else n_cache[r]
             for r in range(num_reqs)]
        log_ranges = None
        if ring is not None and num_drafts is not None and getattr(writer, "evicted_in_log", False):
            # the drafts are each request's last rows; the log holds their slots' old rows in draft order
            log_ranges, row = [], 0
            for r, nd in enumerate(num_drafts):
                first_draft = int(pos_host[qsl[r + 1] - nd]) if nd else 0
                log_ranges.append((first_draft - ring, row, int(nd)))
                row += int(nd)
        extra = dict(read_from=read_from, cache_ends=n_cache, log_ranges=log_ranges, sliding=sliding,
                     ledger=ledger, tree_mask=None if tree_mask is None else tree_mask.to(dev), tree_lo=tree_lo)
        if triton:
            rows = torch.as_tensor([r for w in window_rows for r in w], dtype=torch.long, device=dev) \
                if in_buffer else None
            i32 = dict(dtype=torch.int32, device=dev)
            kernel = KernelArgs(tables.to(torch.int32), torch.tensor(n_cache, **i32), torch.tensor(qsl, **i32), rows,
                                torch.tensor([0, *accumulate(n_win)], **i32) if in_buffer else None,
                                sliding.size if sliding is not None else 0, ring or 0,
                                torch.tensor([a for a, _, _ in log_ranges], **i32) if log_ranges else None,
                                torch.tensor([0, *accumulate(n for _, _, n in log_ranges)], **i32)
                                if log_ranges else None, int(qlens.max()) if num_reqs else 0,
                                None if tree_lo is None else torch.tensor(tree_lo, **i32))
            return cls(positions, slot_mapping, qsl, None, None, None, cache, writer, write_offset, kernel, **extra)
        # every cached position of every request in one slot-mapping call, then split per request
        counts = torch.tensor([e - a for a, e in zip(read_from, n_cache)], dtype=torch.long)
        starts = torch.repeat_interleave(counts.cumsum(0) - counts - torch.tensor(read_from), counts)
        read_pos = (torch.arange(int(counts.sum())) - starts).to(dev)
        read_req = torch.repeat_interleave(torch.arange(num_reqs), counts).to(dev)
        read_slots = list(build_slot_mapping(tables, read_req, read_pos, bs, ring).split(counts.tolist()))
        masks = []
        for r in range(num_reqs):
            key_pos = read_from[r] + torch.arange(int(counts[r]) + (n_win[r] if in_buffer else 0))
            q = pos_host[qsl[r]:qsl[r + 1], None]
            visible = key_pos[None, :] <= q
            if sliding is not None:
                visible &= key_pos[None, :] > q - sliding.size
            if tree_mask is not None:     # key_pos is the key index: the window's rows from tree_lo[r] on
                from nwor_lab.ops.verify_attention import tree_visible
                visible = tree_visible(visible, key_pos, tree_mask[qsl[r]:qsl[r + 1]].cpu(), tree_lo[r])
            masks.append(visible.to(dev))
        rows = None
        if in_buffer:
            rows = [torch.as_tensor(list(w), dtype=torch.long, device=dev) for w in window_rows]
        return cls(positions, slot_mapping, qsl, read_slots, rows, masks, cache, writer, write_offset, **extra)


@dataclass
class KernelArgs:
    """The verify-attention kernel's view of one pass (device tensors, built once for all layers).

    block_tables `[R, max_blocks]` int32, cache_lens `[R]` int32 (positions read from the cache),
    query_start_loc `[R+1]` int32; when the writer keeps the window in a buffer: win_rows
    `[sum w_r]` int64 (each request's window rows, in position order) and win_start `[R+1]` int32.
    sliding_window / ring_slots: W and S (0: off); log_lo `[R]` / log_start `[R+1]` int32: the
    positions read from the writer's log (cow on a ring), or None. max_query_len: the most rows any
    request has in this pass, known on the host (0: unknown).
    """

    block_tables: torch.Tensor
    cache_lens: torch.Tensor
    query_start_loc: torch.Tensor
    win_rows: torch.Tensor | None
    win_start: torch.Tensor | None
    sliding_window: int = 0
    ring_slots: int = 0
    log_lo: torch.Tensor | None = None
    log_start: torch.Tensor | None = None
    max_query_len: int = 0      # host bound on any request's rows (0: unknown): the kernel's query tile
    tree_lo: torch.Tensor | None = None   # [R] int32 with the metadata's tree_mask (tree windows)


_triton_ok: bool | None = None


def use_kernel(attention: str, device: torch.device) -> bool:
    """Whether passes on `device` use the Triton verify-attention kernel (see module doc)."""
    global _triton_ok
    if attention == "torch" or device.type != "cuda":
        if attention == "triton" and device.type != "cuda":
            raise ValueError("attention='triton' needs CUDA tensors; use 'auto' or 'torch' on "
                             f"{device.type} (LabConfig.attention / NWOR_LAB_ATTENTION)")
        return False
    if _triton_ok is None:
        import importlib.util
        _triton_ok = importlib.util.find_spec("triton") is not None
    if attention == "triton" and not _triton_ok:
        raise RuntimeError("attention='triton' but Triton is not installed: pip install triton, or "
                           "use attention='auto' / 'torch'")
    return _triton_ok


def write_and_attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     md: AttentionMetadata, scale: float) -> torch.Tensor:
    """q `[T, Hq, D]`, k/v `[T, H, D]` (RoPE applied) -> attention output `[T, Hq, D]`.

    The write goes through `md.writer`, then each request attends to its keys as described in
    the module docstring. Grouped-query: Hq // H query heads share a KV head.
    """
    cache = md.cache
    md.writer.write(layer, k, v, token_offset=md.write_offset)
    if md.ledger is not None:
        md.ledger.check_reads(layer, md)      # debug: every cache read holds the position it is read as
    if md.kernel is not None:
        return _kernel_attend(layer, q, md, scale)
    log_k = log_v = None
    if md.log_ranges is not None:
        log_k, log_v = md.writer.log_kv(layer)
    win_k = win_v = None
    if md.window_rows is not None:
        win = md.writer.window_kv(layer)
        if win is None:
            raise RuntimeError(f"layer {layer}: the writer declares window_in_buffer but window_kv() "
                               f"returned None; a policy with window_in_buffer must return its window")
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
        if log_k is not None and md.log_ranges[r][2]:
            # positions this window's draft writes evicted from the ring: their rows as logged
            first, row, n = md.log_ranges[r]
            a, b = max(first, md.read_from[r]), min(first + n, md.cache_ends[r])
            if b > a:
                keys, values = keys.clone(), values.clone()
                rows = slice(row + a - first, row + b - first)
                keys[a - md.read_from[r]:b - md.read_from[r]], values[a - md.read_from[r]:b - md.read_from[r]] = \
                    cache.dequantize_rows(layer, log_k[rows], log_v[rows])
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


def _kernel_attend(layer: int, q: torch.Tensor, md: AttentionMetadata, scale: float) -> torch.Tensor:
    from nwor_lab.ops.verify_attention import verify_attention

    cache, a = md.cache, md.kernel
    win_k = win_v = None
    if a.win_rows is not None:
        win_k, win_v = md.writer.window_kv(layer)
    ks, vs = cache._scales[layer] if cache.is_fp8 else (None, None)
    key_cache, value_cache = cache._layers[layer]
    log_k = log_v = None
    if a.log_lo is not None:
        log_k, log_v = md.writer.log_kv(layer)
    return verify_attention(q, key_cache, value_cache, a.block_tables, a.cache_lens, a.query_start_loc,
                            md.positions, win_key=win_k, win_value=win_v, win_rows=a.win_rows,
                            win_start=a.win_start, k_scale=ks, v_scale=vs, scale=scale,
                            backend="triton" if q.is_cuda else "reference", sliding_window=a.sliding_window,
                            ring_slots=a.ring_slots, log_key=log_k, log_value=log_v, log_lo=a.log_lo,
                            log_start=a.log_start, tree_mask=md.tree_mask, tree_lo=a.tree_lo,
                            max_query_len=a.max_query_len, trusted=True)
