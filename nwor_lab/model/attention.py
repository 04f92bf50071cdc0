"""Paged attention, torch reference: write the pass's K/V through a `KVWriter`, then read keys.

Where a request's keys come from is what the writer declares (nwor_lab.model.writer):
  positions before the window          always from the paged cache;
  the window's own positions           from the cache (where `write` just put them), or, when
                                       `writer.window_in_buffer`, from `writer.window_kv(layer)`,
                                       rows `kernel.win_rows` (causal inside the window).
`AttentionMetadata` fixes both per forward pass, once for all layers, as device tensors.

With a sliding window (`sliding`, nwor_lab.kv.ring.SlidingWindow) a query at q attends q - W + 1 .. q:
each request reads the cache from its first query's q - W + 1 on (through the ring when the cache
is one). On a ring, a writer that declares `evicted_in_log` (cow) has saved what its drafts'
writes evict; those positions are read from `writer.log_kv(layer)` instead of the overwritten slots.

Two implementations read the same metadata, `kernel` (block tables, cached lengths, query starts,
window rows; `AttentionMetadata.attention`, `LabConfig.attention` picks one), through
`nwor_lab.ops.verify_attention`:
  torch    its reference: per request, gather its keys, one masked SDPA (the mask from the same
           tensors, `request_mask`); host reads, so never inside a captured graph
  triton   one launch per layer for the whole batch, keys read through the block tables, the
           window from the cache or the staging buffer
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
    """One forward pass over a flattened variable-length batch of `R` requests, `T` tokens, in the
    one form both attention implementations read: device tensors (the kernel's arguments).

    positions       [T] int64   position of each token in its request
    slot_mapping    [T] int64   where its K/V belongs in the cache (-1: nowhere)
    cache           the PagedKVCache read and written
    writer          the KVWriter this pass writes through (a write policy with an open window,
                    or a DirectWriter)
    kernel          KernelArgs: block tables, cached lengths, query starts, window rows, sliding
                    window, ring, log ranges, tree_lo (see KernelArgs)
    write_offset    row of this pass's first token inside the writer's window
    attention       which implementation reads `kernel`: "auto" / "torch" / "triton" (`use_kernel`)
    sliding         the SlidingWindow, or None
    ledger          a RingLedger checking every cache read (debug mode), or None
    states          the state policy (nwor_lab.state) with this pass's window open, for a hybrid
                    target's linear-attention layers (None: the target has none); set by the caller
    tree_mask       [T, words] int64 | None: a pass over tree windows (nwor_lab.speculative.tree_window): request r's
                    window rows (key index kernel.tree_lo[r] + j) are visible to a query iff bit j of
                    its row is set (its ancestors and itself)

    There is no host form: a host value (the ledger's, a test's `mask`) is read from these tensors.
    """

    positions: torch.Tensor
    slot_mapping: torch.Tensor
    cache: object
    writer: KVWriter
    kernel: "KernelArgs"
    write_offset: int = 0
    attention: str = "auto"
    sliding: SlidingWindow | None = None
    ledger: object = None
    states: object = None
    tree_mask: torch.Tensor | None = None

    @classmethod
    def build(cls, cache, writer: KVWriter | None, positions, query_lens, block_tables, context_lens, *,
              window_rows=None, write_offset: int = 0, slot_mapping=None, attention: str = "auto",
              sliding: SlidingWindow | None = None, num_drafts=None, ledger=None,
              tree_mask: torch.Tensor | None = None) -> "AttentionMetadata":
        """The device form from a caller's host values (tests, prefix caching's passes, benches);
        the engine's steps build theirs from their device buffers instead (nwor_lab.engine.step).
        positions [T]; query_lens, context_lens: ints per request; block_tables: block-id lists.

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
        use_kernel(attention, dev)      # refuses triton off CUDA / without Triton, naming the fix
        # the host copy, from the caller's list (a device tensor's copy syncs: made only when needed)
        on_host = not torch.is_tensor(positions) or positions.device.type == "cpu"
        pos_host = torch.as_tensor(positions, dtype=torch.long) if on_host else None
        positions = torch.as_tensor(positions, dtype=torch.long, device=dev)
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
        log_lo = log_start = None
        if ring is not None and num_drafts is not None and getattr(writer, "evicted_in_log", False):
            # the drafts are each request's last rows; the log holds their slots' old rows in draft order
            if pos_host is None:
                pos_host = positions.cpu()
            log_lo = [(int(pos_host[qsl[r + 1] - nd]) if nd else 0) - ring for r, nd in enumerate(num_drafts)]
            log_start = [0, *accumulate(int(n) for n in num_drafts)]
        i32 = dict(dtype=torch.int32, device=dev)
        rows = torch.as_tensor([r for w in window_rows for r in w], dtype=torch.long, device=dev) \
            if in_buffer else None
        kernel = KernelArgs(tables.to(torch.int32), torch.tensor(n_cache, **i32), torch.tensor(qsl, **i32), rows,
                            torch.tensor([0, *accumulate(n_win)], **i32) if in_buffer else None,
                            sliding.size if sliding is not None else 0, ring or 0,
                            None if log_lo is None else torch.tensor(log_lo, **i32),
                            None if log_start is None else torch.tensor(log_start, **i32),
                            int(qlens.max()) if num_reqs else 0,
                            None if tree_lo is None else torch.tensor(tree_lo, **i32))
        return cls(positions, slot_mapping, cache, writer, kernel, write_offset, attention, sliding, ledger,
                   tree_mask=None if tree_mask is None else tree_mask.to(dev))

    def mask(self, r: int) -> torch.Tensor:
        """Request r's visibility `[q_r, keys]` bool, read from the device form on the host (tests,
        teaching): key i is position lo + i (the cache's, then the window's rows; `request_mask`)."""
        from nwor_lab.ops.verify_attention import request_mask
        a = self.kernel
        qsl = a.query_start_loc.tolist()
        n_win = 0 if a.win_start is None else int(a.win_start[r + 1] - a.win_start[r])
        tree = None if self.tree_mask is None else self.tree_mask[qsl[r]:qsl[r + 1]].cpu()
        return request_mask(self.positions[qsl[r]:qsl[r + 1]].cpu(), int(a.cache_lens[r]), n_win, a.sliding_window,
                            tree, None if a.tree_lo is None else int(a.tree_lo[r]))[1]


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
    md.writer.write(layer, k, v, token_offset=md.write_offset)
    if md.ledger is not None:
        md.ledger.check_reads(layer, md)      # debug: every cache read holds the position it is read as
    return _kernel_attend(layer, q, md, scale)


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
                            backend="triton" if use_kernel(md.attention, q.device) else "reference",
                            sliding_window=a.sliding_window,
                            ring_slots=a.ring_slots, log_key=log_k, log_value=log_v, log_lo=a.log_lo,
                            log_start=a.log_start, tree_mask=md.tree_mask, tree_lo=a.tree_lo,
                            max_query_len=a.max_query_len, trusted=True)
