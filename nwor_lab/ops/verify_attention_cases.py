"""Random verify-attention batches for the tests and the benchmark (`make_verify_attention_case`).

A case is what one layer's attention sees in a verify pass of R requests:
  without a window source (off / cow: the window was written into the cache first), request r's
    cache holds context + q_len positions and its queries are the last q_len of them;
  with a window source (stage: the window waits in a staging buffer), the cache holds the
    context only, the window holds `extra` earlier window tokens plus this pass's q_len, and the
    queries are the last q_len window positions.
Block tables are random, non-contiguous block ids; columns past a request's last block hold -1,
so a kernel that reads past cache_lens reads garbage (or faults), never a plausible key.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nwor_lab.kv.cache import CACHE_DTYPES
from nwor_lab.kv.layout import allocate
from nwor_lab.ops.quant import quantize, raw


@dataclass
class VerifyAttentionCase:
    """The arguments of one verify_attention call (`case.kwargs()`), plus what made them."""

    name: str
    q: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_tables: torch.Tensor
    cache_lens: torch.Tensor
    query_start_loc: torch.Tensor
    positions: torch.Tensor
    scale: float
    win_key: torch.Tensor | None = None
    win_value: torch.Tensor | None = None
    win_rows: torch.Tensor | None = None
    win_start: torch.Tensor | None = None
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None
    sliding_window: int = 0
    ring_slots: int = 0
    log_key: torch.Tensor | None = None
    log_value: torch.Tensor | None = None
    log_lo: torch.Tensor | None = None
    log_start: torch.Tensor | None = None
    tree_mask: torch.Tensor | None = None
    tree_lo: torch.Tensor | None = None
    meta: dict = field(default_factory=dict)

    def kwargs(self) -> dict:
        kw = {name: getattr(self, name) for name in (
            "q", "key_cache", "value_cache", "block_tables", "cache_lens", "query_start_loc", "positions",
            "win_key", "win_value", "win_rows", "win_start", "k_scale", "v_scale", "scale")}
        if self.sliding_window:      # only when used: older callers pass kwargs() to the bare launch
            kw.update({name: getattr(self, name) for name in RING_FIELDS})
        if self.tree_mask is not None:
            kw.update({name: getattr(self, name) for name in TREE_FIELDS})
        return kw

    def kv_bytes(self) -> int:
        """Bytes of K and V a kernel must read: every cached key plus every window row, once."""
        h, d = self.key_cache.shape[2:]
        n = int(self.cache_lens.sum()) * self.key_cache.element_size()
        if self.win_rows is not None:
            n += self.win_rows.numel() * self.win_key.element_size()
        return 2 * n * h * d


RING_FIELDS = ("sliding_window", "ring_slots", "log_key", "log_value", "log_lo", "log_start")
TREE_FIELDS = ("tree_mask", "tree_lo")


def _ints(value, n: int, lo: int, hi: int, gen: torch.Generator) -> list[int]:
    """`value` as n ints: a list as given, an int repeated, None drawn uniformly from [lo, hi]."""
    if value is None:
        return torch.randint(lo, hi + 1, (n,), generator=gen).tolist()
    if isinstance(value, int):
        return [value] * n
    if len(value) != n:
        raise ValueError(f"expected {n} values (one per request), got {len(value)}")
    return [int(v) for v in value]


def make_verify_attention_case(*, num_reqs: int = 4, query_lens=None, max_query_len: int = 16,
                               context_lens=None, max_context: int = 100, window_extra=None,
                               block_size: int = 16, num_kv_heads: int = 2, num_q_heads: int | None = None,
                               head_size: int = 64, dtype=torch.bfloat16, cache_dtype: str = "auto",
                               layout: str = "NHD", window: bool = False, fused_q: bool = False,
                               spare_blocks: int = 3, seed: int = 0, device="cpu") -> VerifyAttentionCase:
    """One random batch. query_lens / context_lens / window_extra: an int, a list per request, or
    None (drawn: q_len in 1..max_query_len, context in 0..max_context, extra in 0..3).

    num_q_heads defaults to 4 x num_kv_heads (GQA group 4). fp8 cache dtypes get per-head scales.
    fused_q: q is a strided view into a fused [T, Hq + 2 H, D] projection, as a model hands it.
    """
    gen = torch.Generator().manual_seed(seed)
    hq = 4 * num_kv_heads if num_q_heads is None else num_q_heads
    h, d, bs = num_kv_heads, head_size, block_size
    qlens = _ints(query_lens, num_reqs, 1, max_query_len, gen)     # 0 allowed when given
    ctx = _ints(context_lens, num_reqs, 0, max_context, gen)
    extra = _ints(window_extra, num_reqs, 0, 3, gen) if window else [0] * num_reqs
    # cached positions and the position of each request's first query
    cache_lens = ctx if window else [c + n for c, n in zip(ctx, qlens)]
    first_pos = [c + e for c, e in zip(ctx, extra)]
    # blocks for every position a request has, the window's too (stage reserves its slots: commit
    # writes the accepted rows there)
    need = [-(-(c + e + n) // bs) for c, e, n in zip(ctx, extra, qlens)]
    max_blocks = max(need + [1]) + 1                        # one spare column, always -1
    num_blocks = sum(need) + spare_blocks
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.full((num_reqs, max_blocks), -1, dtype=torch.int32)
    at = 0
    for r, n in enumerate(need):
        tables[r, :n] = torch.tensor(perm[at:at + n], dtype=torch.int32)
        at += n

    storage = CACHE_DTYPES[cache_dtype][0] or dtype
    k_scale = v_scale = None
    if storage != dtype:                                    # fp8: per-head scales, values well in range
        k_scale = 0.01 + 0.03 * torch.rand(h, generator=gen)
        v_scale = 0.01 + 0.03 * torch.rand(h, generator=gen)
    key_cache = allocate((num_blocks, bs, h, d), layout, storage, "cpu")
    value_cache = allocate((num_blocks, bs, h, d), layout, storage, "cpu")
    for cache, sc, shift in ((key_cache, k_scale, 0.0), (value_cache, v_scale, 0.5)):
        x = (torch.randn(num_blocks * bs, h, d, generator=gen) * 2 + shift).to(dtype)
        cache.copy_(quantize(x, storage, sc).view(num_blocks, bs, h, d))

    T = sum(qlens)
    if fused_q:
        qkv = torch.randn(T, hq + 2 * h, d, generator=gen).to(dtype)
        q = qkv[:, :hq]
    else:
        q = torch.randn(T, hq, d, generator=gen).to(dtype)
    qsl = torch.tensor([0] + torch.tensor(qlens).cumsum(0).tolist(), dtype=torch.int32)
    positions = torch.cat([torch.arange(p, p + n) for p, n in zip(first_pos, qlens)]).long()

    case = VerifyAttentionCase(
        name=(f"R{num_reqs}-H{hq}/{h}-D{d}-BS{bs}-{layout}-{str(dtype).replace('torch.', '')}-{cache_dtype}-"
              f"{'win' if window else 'cache'}{'-fusedq' if fused_q else ''}-s{seed}"),
        q=q, key_cache=key_cache, value_cache=value_cache, block_tables=tables,
        cache_lens=torch.tensor(cache_lens, dtype=torch.int32), query_start_loc=qsl, positions=positions,
        scale=d ** -0.5, k_scale=k_scale, v_scale=v_scale,
        meta=dict(query_lens=qlens, context_lens=ctx, window_extra=extra, layout=layout, dtype=dtype,
                  cache_dtype=cache_dtype))
    if window:
        wlens = [e + n for e, n in zip(extra, qlens)]
        tw = sum(wlens) + 5                                  # spare rows no request reads
        case.win_key = (torch.randn(tw, h, d, generator=gen) * 2).to(dtype)
        case.win_value = (torch.randn(tw, h, d, generator=gen) * 2 + 0.5).to(dtype)
        case.win_rows = torch.randperm(tw, generator=gen)[:sum(wlens)].to(torch.int32 if seed % 2 else torch.int64)
        case.win_start = torch.tensor([0] + torch.tensor(wlens).cumsum(0).tolist(), dtype=torch.int32)
    return case_to(case, device)


def case_to(case: VerifyAttentionCase, device) -> VerifyAttentionCase:
    """The same case on `device`; strides (HND caches, fused q views) are kept."""
    device = torch.device(device)

    def move(t):
        if t is None or t.device == device:
            return t
        if t.is_contiguous():
            return t.to(device)
        # same strides on the device (an HND cache view, a fused-projection q view)
        base = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device)
        base.copy_(t)
        return base

    moved = {name: move(getattr(case, name)) for name in case.kwargs()
             if name not in ("scale", *RING_FIELDS, *TREE_FIELDS)}
    ring = {name: move(getattr(case, name)) if torch.is_tensor(getattr(case, name)) else getattr(case, name)
            for name in RING_FIELDS + TREE_FIELDS}
    return VerifyAttentionCase(case.name, **moved, **ring, scale=case.scale, meta=dict(case.meta))


def as_ring(case: VerifyAttentionCase, sliding_window: int, ring_slots: int, log: bool = False,
            seed: int = 0) -> VerifyAttentionCase:
    """The same attention, with a sliding window of W = `sliding_window`, on a ring cache.

    Every request's cached positions 0 .. cache_lens[r]-1 are written in order into a ring of
    `ring_slots` slots (position p at ring index p mod S, later positions overwriting earlier
    ones) in fresh, shuffled blocks; slots no position reached hold noise. `log` (cow on a ring;
    a case without a window source): the positions the request's query rows after the first
    evicted (row at P evicts P - S) come from a log of the rows they held, as cow saved them.
    The linear case with `sliding_window` set (`with_window(case, W)`) is the same attention.
    """
    if log and case.win_rows is not None:
        raise ValueError("as_ring(log=True): cow writes its window into the cache; give a case without a window")
    gen = torch.Generator().manual_seed(seed)
    nb, bs, h, d = case.key_cache.shape
    lens, qsl = case.cache_lens.tolist(), case.query_start_loc.tolist()
    per = -(-ring_slots // bs)
    R = len(lens)
    num_blocks = R * per + 2
    layout = case.meta.get("layout", "NHD")
    key_cache = allocate((num_blocks, bs, h, d), layout, case.key_cache.dtype, case.key_cache.device)
    value_cache = allocate((num_blocks, bs, h, d), layout, case.key_cache.dtype, case.key_cache.device)
    noise = (torch.randn(num_blocks, bs, h, d, generator=gen) * 3).to(case.q.dtype)
    for c, sc in ((key_cache, case.k_scale), (value_cache, case.v_scale)):
        c.copy_(quantize(noise.view(-1, h, d), c.dtype, sc).view(num_blocks, bs, h, d))
    perm = torch.randperm(num_blocks, generator=gen)[:R * per].view(R, per).to(torch.int32)
    tables = torch.cat([perm, torch.full((R, 1), -1, dtype=torch.int32)], 1)   # a spare -1 column

    def at(table, p, ring):   # (block, offset) of positions p
        i = p % ring if ring else p
        return table.long()[i // bs], i % bs

    log_k, log_v, log_lo, log_start = [], [], [], [0]
    for r, n in enumerate(lens):
        keep = torch.arange(max(0, n - ring_slots), n)            # what survives in the ring
        sb, so = at(case.block_tables[r], keep, 0)
        db, do = at(tables[r], keep, ring_slots)
        raw(key_cache)[db, do], raw(value_cache)[db, do] = raw(case.key_cache)[sb, so], raw(case.value_cache)[sb, so]
        if log:
            first = int(case.positions[qsl[r]]) if qsl[r + 1] > qsl[r] else n
            count = max(0, qsl[r + 1] - qsl[r] - 1)               # the drafts: rows after the first
            evicted = torch.arange(first + 1 - ring_slots, first + 1 - ring_slots + count)
            rows_k = torch.zeros((count, h, d), dtype=case.key_cache.dtype)
            rows_v = torch.zeros_like(rows_k)
            ok = evicted >= 0                                     # negative: the slot held nothing
            eb, eo = at(case.block_tables[r], evicted[ok], 0)
            raw(rows_k)[ok], raw(rows_v)[ok] = raw(case.key_cache)[eb, eo], raw(case.value_cache)[eb, eo]
            log_k.append(rows_k), log_v.append(rows_v)
            log_lo.append(first + 1 - ring_slots), log_start.append(log_start[-1] + count)
    ring = VerifyAttentionCase(case.name + f"-ring{ring_slots}-W{sliding_window}" + ("-log" if log else ""),
                               q=case.q, key_cache=key_cache, value_cache=value_cache, block_tables=tables,
                               cache_lens=case.cache_lens, query_start_loc=case.query_start_loc,
                               positions=case.positions, scale=case.scale, win_key=case.win_key,
                               win_value=case.win_value, win_rows=case.win_rows, win_start=case.win_start,
                               k_scale=case.k_scale, v_scale=case.v_scale, sliding_window=sliding_window,
                               ring_slots=ring_slots, meta=dict(case.meta))
    if log:
        ring.log_key, ring.log_value = torch.cat(log_k), torch.cat(log_v)
        ring.log_lo = torch.tensor(log_lo, dtype=torch.int32)
        ring.log_start = torch.tensor(log_start, dtype=torch.int32)
    return ring


def with_window(case: VerifyAttentionCase, sliding_window: int) -> VerifyAttentionCase:
    """The same linear case, its queries attending the last `sliding_window` positions only."""
    kw = {name: getattr(case, name) for name in case.kwargs() if name not in ("scale", *RING_FIELDS)}
    return VerifyAttentionCase(case.name + f"-W{sliding_window}", **kw, scale=case.scale,
                               sliding_window=sliding_window, meta=dict(case.meta))


def make_tree_attention_case(parents, *, context_lens=None, window: bool = False, seed: int = 0,
                             **kwargs) -> VerifyAttentionCase:
    """A verify pass over tree windows (nwor_lab.speculative.tree_window): request r's queries are `[t_last, node_1 ..
    node_N]` with `parents[r]` (node i+1 -> 0 .. i), at positions n + depth (n = context_lens[r]);
    its window rows sit at key indices n .. n + N (tree_lo = n): in the cache (write-all) or in the
    window source (`window`, stage). Other arguments as make_verify_attention_case."""
    # the bits are made here, not with nwor_lab.speculative.tree_window (a layer above ops): a second implementation of
    # the same rule, which the tests compare against the window's own (tests/test_tree_attention.py)
    parents = [[int(q) for q in p] for p in parents]
    for r, p in enumerate(parents):
        if any(not 0 <= q <= i for i, q in enumerate(p)):
            raise ValueError(f"parents[{r}]: node i+1's parent must be 0 (t_last) or an earlier node 1..i")
    qlens = [1 + len(p) for p in parents]
    case = make_verify_attention_case(num_reqs=len(parents), query_lens=qlens, context_lens=context_lens,
                                      window=window, window_extra=0, seed=seed, **kwargs)
    ctx = case.meta["context_lens"]
    words = -(-max(qlens) // 64)
    depth, bits = [], []
    for p in parents:
        d, rows = [0], [{0}]
        for i, q in enumerate(p, start=1):
            d.append(d[q] + 1)
            rows.append(rows[q] | {i})
        depth += d
        for row in rows:
            w = [sum(1 << (j - 64 * k) for j in row if 64 * k <= j < 64 * (k + 1)) for k in range(words)]
            bits.append([x - (1 << 64) if x >= 1 << 63 else x for x in w])
    case.positions = torch.tensor(depth, dtype=torch.long).to(case.positions.device) + \
        torch.repeat_interleave(torch.tensor(ctx), torch.tensor(qlens)).to(case.positions.device)
    case.tree_mask = torch.tensor(bits, dtype=torch.int64, device=case.q.device)
    case.tree_lo = torch.tensor(ctx, dtype=torch.int32, device=case.q.device)
    case.name += "-tree"
    case.meta["parents"] = parents
    return case


def window_written_to_cache(case: VerifyAttentionCase) -> VerifyAttentionCase:
    """The same attention with the window committed: each request's window rows written (quantised
    like any cache write) into its reserved slots at positions cache_lens[r] + j, cache_lens grown
    by the window, no window source. `stage` reading its buffer must attend to these numbers."""
    if case.win_rows is None:
        raise ValueError("window_written_to_cache: the case has no window source")
    key_cache, value_cache = case.key_cache.clone(), case.value_cache.clone()
    bs = key_cache.shape[1]
    lens = case.cache_lens.tolist()
    ws = case.win_start.tolist()
    new_lens = []
    for r, n in enumerate(lens):
        rows = case.win_rows[ws[r]:ws[r + 1]].long()
        p = torch.arange(n, n + rows.numel(), device=rows.device)
        blk, off = case.block_tables[r].long()[p // bs], p % bs
        key_cache[blk, off] = quantize(case.win_key[rows], key_cache.dtype, case.k_scale)
        value_cache[blk, off] = quantize(case.win_value[rows], value_cache.dtype, case.v_scale)
        new_lens.append(n + rows.numel())
    kw = {name: getattr(case, name) for name in case.kwargs() if name not in (
        "key_cache", "value_cache", "cache_lens", "win_key", "win_value", "win_rows", "win_start", "scale")}
    return VerifyAttentionCase(case.name + "-committed", key_cache=key_cache, value_cache=value_cache,
                               cache_lens=torch.tensor(new_lens, dtype=torch.int32, device=case.cache_lens.device),
                               scale=case.scale, meta=dict(case.meta), **kw)
