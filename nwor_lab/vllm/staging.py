"""Staging blocks: a paged home for `stage`'s window, so vLLM's own C++ kernel attends over it.

Under `stage` the window's K/V wait in the policy's buffer and never reach the request's blocks
before commit, so `ops.cpu_attention_with_kv_cache` (which reads only through the block table)
cannot see them. Each layer's KV tensor is therefore allocated `extra` blocks larger than
vLLM's block pool (`enlarge_kv_cache_config`; the scheduler never hands those blocks out), and
per pass:

    plan (once per pass, layer-independent)   StagingPass: for each request with staged rows, the
        blocks its staged positions fall in get a spare block each; the metadata's block table is
        a copy with those entries swapped to the spares (everything else is vLLM's metadata)
    per layer (fill)                           the real blocks are copied to their spares, then the
        staged rows are written into the copies at their positions (vLLM's own write op);
        vLLM's forward runs on the swapped metadata

The real blocks are only read: a rejected row never reaches them (stage's contract, checked
byte for byte by the runtime's `check`). Anything the plan cannot express (too few spares, a
row without a slot, a block table too narrow) returns None: the caller falls back to the lab's
torch attention (`ops.verify_attention_batched`), which stays the reference.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch


def staging_blocks_needed(max_num_seqs: int, max_rows_per_request: int, block_size: int) -> int:
    """Spare blocks for one pass: each request's staged rows (at most `max_rows_per_request`
    consecutive positions) span at most ceil(rows / block_size) + 1 blocks."""
    return max_num_seqs * (math.ceil(max_rows_per_request / block_size) + 1)


def enlarge_kv_cache_config(kv_cache_config, extra: int):
    """A copy of vLLM's `KVCacheConfig` whose tensors hold `extra` blocks more than
    `kv_cache_config.num_blocks` (the pool's count, which the scheduler keeps); None when a
    tensor's placement is not one this function knows (the plugin then runs without staging
    blocks). Layer-outermost tensors (`layer_stride = block_stride * num_blocks`) get the larger
    layer stride and their layers' offsets moved along; block-outermost ones keep their strides."""
    n = kv_cache_config.num_blocks
    if extra <= 0 or n <= 0 or not kv_cache_config.kv_cache_tensors:
        return None
    out = copy.deepcopy(kv_cache_config)
    sizes = {t.size for t in out.kv_cache_tensors}
    if len(sizes) != 1 or next(iter(sizes)) % n:
        return None
    new_size = next(iter(sizes)) // n * (n + extra)
    for t in out.kv_cache_tensors:
        if getattr(t, "host_resident", False):
            return None
        if t.layer_stride == t.block_stride * n:                   # layer-outermost
            if t.offset % t.layer_stride:
                return None
            new_stride = t.block_stride * (n + extra)
            t.offset = t.offset // t.layer_stride * new_stride
            t.layer_stride = new_stride
        elif not t.layer_stride < t.block_stride:                  # block-outermost keeps its strides
            return None
        t.size = new_size
    out.num_blocks = n + extra
    return out


@dataclass
class StagingPass:
    """One pass's staging plan (every layer of the pass uses it)."""
    metadata: object                 # vLLM's attention metadata, block_table swapped to the spares
    src: torch.Tensor                # [B] real blocks copied ...
    dst: torch.Tensor                # [B] ... into these spare blocks
    slots: torch.Tensor              # [T] per window row: its slot in the spares (-1: not staged yet)


class StagingBlocks:
    """The spare blocks `first .. first + count - 1` of every layer's KV tensor."""

    def __init__(self, first: int, count: int, block_size: int):
        self.first, self.count, self.block_size = first, count, block_size

    def plan(self, token_req: torch.Tensor, num_reqs: int, ranges, md) -> StagingPass | None:
        """Where the staged rows `ranges` (sorted `[start, end)` window rows; `token_req[row]` its
        request) sit for `md`: request r's staged rows, in row order, are its last positions
        (seq_lens[r] - count_r ..), as the lab's torch attention reads them. None: not expressible."""
        bs = self.block_size
        rows = np.arange(*ranges[0]) if len(ranges) == 1 else np.concatenate([np.arange(a, b) for a, b in ranges])
        req = token_req.numpy()[rows]
        if (req[1:] < req[:-1]).any():                              # step-major (a chain): sort by request
            order = np.argsort(req, kind="stable")
            rows, req = rows[order], req[order]                     # per request, in row order
        counts = np.bincount(req, minlength=num_reqs)
        seq_lens = md.seq_lens.numpy()[:num_reqs].astype(np.int64)
        cache_lens = seq_lens - counts
        if (cache_lens < 0).any():
            return None
        start = np.concatenate([[0], np.cumsum(counts)])
        pos = cache_lens[req] + (np.arange(rows.size) - start[req])           # [n] each row's position
        has = np.flatnonzero(counts)
        first_b = cache_lens[has] // bs
        last_b = (seq_lens[has] - 1) // bs
        nblk = last_b - first_b + 1
        total = int(nblk.sum())
        table = md.block_table
        if total > self.count or int(last_b.max(initial=0)) >= table.shape[1]:
            return None
        blk_req = np.repeat(has, nblk)                                         # [B]
        blk_idx = np.repeat(first_b, nblk) + (np.arange(total) - np.repeat(np.cumsum(nblk) - nblk, nblk))
        spare = self.first + np.arange(total)
        tbl = table.numpy()
        src = tbl[blk_req, blk_idx].astype(np.int64)
        swapped = table.clone()
        swapped.numpy()[blk_req, blk_idx] = spare
        # row -> its spare: the request's first spare plus (block of its position - first block)
        base = np.zeros(num_reqs, dtype=np.int64)
        base[has] = self.first + np.cumsum(nblk) - nblk
        first_all = np.zeros(num_reqs, dtype=np.int64)
        first_all[has] = first_b
        row_block = base[req] + pos // bs - first_all[req]
        slots = np.full(token_req.shape[0], -1, dtype=np.int64)
        slots[rows] = row_block * bs + pos % bs
        t_ = torch.from_numpy
        staged = copy.copy(md)                  # vLLM's metadata as it is, but for the block table
        staged.block_table = swapped
        return StagingPass(staged, t_(src), t_(spare.astype(np.int64)), t_(slots))

    @staticmethod
    def fill(p: StagingPass, packed: torch.Tensor, write_rows, win_key, win_value) -> None:
        """One layer: copy the real blocks into their spares (`packed` is vLLM's tensor
        `[num_blocks, H, BS, 2*D]`, one block a contiguous run), then write the window's rows
        (`win_key/win_value [T, H, D]`) at `p.slots` with `write_rows(key, value, slots)`, which
        skips slot -1 (vLLM's `cpu_attn_reshape_and_cache`: PagedKVCache.native_writers)."""
        packed.index_copy_(0, p.dst, packed.index_select(0, p.src))
        write_rows(win_key, win_value, p.slots)
