"""The Triton kernels behind `verify_attention` (imported lazily: the package never needs triton).

Grid of the attention kernel: (request, KV head, split of the key range). One program owns ALL of
its request's query rows for its KV head: q_len x group rows in one tile (row m is token
m // group, query head kv_head * group + m % group), so each K/V tile it gathers through the block
table serves every query head that shares it, and is read from memory once per KV head.

Key tiles are BLOCK_N positions long and aligned to multiples of BLOCK_N from position 0, in two
loops: first the tiles that lie wholly in the paged cache (no source test, no bounds mask: the
main, pipelined loop), then the tail tiles, where a position below `cache_len` comes from the
cache and one at or past it from the window rows. The alignment means a key tile holds the same
positions whichever source feeds it, so a window read from the staging buffer is reduced in the
same order as the same window read back from the cache.

Sliding windows (`sliding_window` W > 0): a key is visible to a query at q iff q - W < p <= q, and
the key loop starts at the tile holding the request's first query's q - W + 1, so a request reads
about W keys whatever its context. A ring cache (`ring_slots` S > 0) maps position p to ring index
p mod S before the block table lookup. A log source (`cow` on a ring) serves a range of positions
per request from the log rows instead of the ring: a pointer select, as log and cache share a dtype.

A tree window (`tree_mask` [T, words] int64, `tree_lo` [R] int32): key index p >= tree_lo[r] is a
row of the request's tree, visible to a query iff its ancestor bit is set; below tree_lo the position
rule holds. A tree pass runs in two kernels. The attention kernel (TREE: its key range cut at
min(cache_len, tree_lo), from the cache alone, no window source, no ancestor test) leaves partials;
`_tree_window_kernel` then attends each query row to the request's keys from there on (the tree's
rows: from the cache under write-all, or under stage from the window, in a loop compiled apart, as
with a window every tree row is a window row; per key tile each query row loads the two ancestor
words the tile can touch and a key tests a 32-bit half of one, `_tree_visible`) and merges them
with the partials. Both strategies run the same two kernels over the same tiles, so stage's tree
gives write-all's bits. Why two: with the ancestor test and the window source in the one kernel it ran at
the 255-register cap with 472-912 bytes of stack on an H200, and stage's tree attention cost
1.3-1.5x write-all's at batch >= 8; split, the tree attention costs 0.97-1.02x write-all's and both
strategies' attention took 1.3-2.4x less time (benchmarks/results/tree_window_launch/). The
ancestor test first gathered a word for every query row and key ([BLOCK_M, BLOCK_N] int64, 64-bit
shifts); two words a row took the tree-window kernel to 0.80-0.99x its time (tree_8b_h200.json
against tree_window_launch/two_kernels_final_reps20_h200.json). The kernel still sits at the
register cap and spills at BLOCK_M = 64 with 4 warps (ptxas for sm_90); TREE_WINDOW says which
launch measured best.

Softmax runs in base 2 (exp2, with log2(e) folded into the scale) and online over the tiles. With
more than one split, each program stores its normalised partial output and log-sum-exp in fp32
and `_merge_splits_kernel` combines them (a tree pass: `_tree_window_kernel`, always); with one split
the program writes the output directly.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634

# torch fp8 dtype -> (mantissa bits, smallest normal exponent, largest finite value)
FP8_FORMATS = {
    torch.float8_e4m3fn: (3, -6, 448.0),
    torch.float8_e5m2: (2, -14, 57344.0),
}


@triton.jit
def _round_to_fp8_grid(y, MANT: tl.constexpr, EMIN: tl.constexpr):
    """fp32 `y` (already clamped to the format's range) rounded to the nearest fp8 value, ties to
    even, returned as fp32. Done with arithmetic rather than a cast to fp8 because Triton's CPU
    interpreter mis-rounds casts whose rounding carries into the exponent (127.7 -> 64, not 128);
    this gives torch's bytes on both the interpreter and the GPU."""
    bits = y.to(tl.int32, bitcast=True)
    exp = ((bits >> 23) & 0xFF) - 127
    ulp_exp = tl.maximum(exp, EMIN) - MANT            # below EMIN: the subnormal grid
    inv_ulp = ((127 - ulp_exp) << 23).to(tl.float32, bitcast=True)
    ulp = ((127 + ulp_exp) << 23).to(tl.float32, bitcast=True)
    t = y * inv_ulp                                   # exact (power of two); |t| < 2^(MANT+1)
    # adding and subtracting 1.5 * 2^23 rounds an fp32 of magnitude < 2^22 to an integer, ties even
    return ((t + 12582912.0) - 12582912.0) * ulp


@triton.jit
def _fp8_roundtrip(x, scale, out_dtype: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
                   FMAX: tl.constexpr, FIX_BF16: tl.constexpr):
    """What an fp8 cache hands back for `x`: dequantize(quantize(x)) of nwor_lab.ops.quant."""
    y = tl.div_rn(x.to(tl.float32), scale)            # IEEE division, as torch's x / scale
    y = tl.minimum(tl.maximum(y, -FMAX), FMAX)
    return _cast(_round_to_fp8_grid(y, MANT, EMIN) * scale, out_dtype, FIX_BF16)


@triton.jit
def _cast(x, dtype: tl.constexpr, FIX_BF16: tl.constexpr):
    """`x.to(dtype)`, rounding to nearest even. FIX_BF16 (bf16 under Triton's CPU interpreter, whose
    fp32 -> bf16 cast truncates): round the fp32 bits to the bf16 grid first, then cast exactly."""
    if FIX_BF16:
        bits = x.to(tl.float32).to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536   # clear the low 16 bits, ties to even
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def _softmax_step(q, k, v, visible, m_i, l_i, acc, qk_scale, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """One key tile of online softmax: q [M, D], k/v [N, D], visible [M, N].

    IEEE: fp32 inputs, multiplied without tf32 rounding (fp32 then matches the reference closely).
    UPCAST: bf16 under Triton's CPU interpreter, whose tl.dot multiplies bf16's raw 16-bit integers:
    the operands go to fp32 there (exact: bf16 x bf16 products fit fp32, as on the tensor cores),
    p still rounded to bf16 first, so the interpreter computes what the GPU does.
    """
    if UPCAST:
        q = q.to(tl.float32)
        k = k.to(tl.float32)
    if IEEE or UPCAST:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = tl.where(visible, s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # a row that has seen no visible key yet keeps m = -inf; subtract 0 there instead (no NaN)
    m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_sub)
    p = tl.exp2(s - m_sub[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    p = _cast(p, v.dtype, UPCAST)
    if UPCAST:
        pv = tl.dot(p.to(tl.float32), v.to(tl.float32), input_precision="ieee")
    elif IEEE:
        pv = tl.dot(p, v, input_precision="ieee")
    else:
        pv = tl.dot(p, v)
    acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc


@triton.jit
def _tree_visible(visible, start, p, tok, row_ok, tree_mask, stride_tm, t_lo, tree_words, BLOCK_N: tl.constexpr):
    """`visible [M, N]` with keys p >= t_lo replaced by bit (p - t_lo) of each query's ancestor words.

    The tile's keys start .. start + N - 1 (N <= 64) fall in at most two words: each row loads those
    two words once ([M] each) and a key tests a 32-bit half of one. A word per key ([M, N] int64
    loads and 64-bit shifts) held 64 registers a thread at N = 64 and made the tree kernel spill."""
    tl.static_assert(BLOCK_N <= 64, "a tree key tile spans at most two ancestor words: BLOCK_N <= 64")
    w0 = tl.maximum(start - t_lo, 0) // 64
    at = tree_mask + tok * stride_tm + w0
    word0 = tl.load(at, mask=row_ok & (w0 < tree_words), other=0)
    word1 = tl.load(at + 1, mask=row_ok & (w0 + 1 < tree_words), other=0)
    j = p - t_lo
    jc = tl.maximum(j, 0)
    second = (jc // 64 > w0)[None, :]
    high = ((jc % 64) >= 32)[None, :]
    half = tl.where(second, tl.where(high, (word1 >> 32).to(tl.int32)[:, None], word1.to(tl.int32)[:, None]),
                    tl.where(high, (word0 >> 32).to(tl.int32)[:, None], word0.to(tl.int32)[:, None]))
    bit = (half >> (jc % 32)[None, :]) & 1
    return tl.where((j >= 0)[None, :], bit != 0, visible)


@triton.jit
def _request_keys(query_start_loc, cache_lens, win_start, req, GROUP: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """Request `req`'s first query token, its query rows (tokens x GROUP), its cached keys, and its
    window rows' offset and count in win_rows (0, 0 without a window source)."""
    q_start = tl.load(query_start_loc + req).to(tl.int64)
    q_rows = (tl.load(query_start_loc + req + 1) - q_start).to(tl.int32) * GROUP
    cache_len = tl.load(cache_lens + req)
    if HAS_WINDOW:
        w_start = tl.load(win_start + req)
        w_len = tl.load(win_start + req + 1) - w_start
    else:
        w_start = 0
        w_len = 0
    return q_start, q_rows, cache_len, w_start, w_len


@triton.jit
def _kv_scales(k_scale, v_scale, kvh, FP8: tl.constexpr):
    """An fp8 cache's dequantisation scales of KV head `kvh` (1.0 for a cache in the model dtype)."""
    if FP8:
        ks = tl.load(k_scale + kvh)
        vs = tl.load(v_scale + kvh)
    else:
        ks = 1.0
        vs = 1.0
    return ks, vs


@triton.jit
def _query_tile(q_ptr, positions, q_start, m0, q_rows, kvh, stride_qt, stride_qh, d,
                GROUP: tl.constexpr, BLOCK_M: tl.constexpr):
    """Query rows m0 .. m0 + BLOCK_M of a request (row m: token m // GROUP, query head kvh * GROUP +
    m % GROUP) -> (row_ok [M], tok [M], head [M], q [M, D], pos [M]; rows past q_rows masked)."""
    rows = m0 + tl.arange(0, BLOCK_M)
    row_ok = rows < q_rows
    tok = q_start + rows // GROUP
    head = kvh * GROUP + rows % GROUP
    q = tl.load(q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None], other=0.0)
    pos = tl.load(positions + tok, mask=row_ok, other=-1)
    return row_ok, tok, head, q, pos


@triton.jit
def _window_tile(start, end, cache_len, w_start, win_k, win_v, win_rows, kvh, stride_wkt, stride_wkh, stride_wvt,
                 stride_wvh, d, BLOCK_N: tl.constexpr):
    """A key tile wholly past the cache: positions p [N] (p >= cache_len), those below `end` read from
    the window rows -> (p, in_win [N], K/V [N, D], 0 where not in_win)."""
    p = start + tl.arange(0, BLOCK_N)
    in_win = p < end
    row = tl.load(win_rows + w_start + (p - cache_len), mask=in_win, other=0).to(tl.int64)
    k = tl.load(win_k + (row * stride_wkt + kvh * stride_wkh)[:, None] + d[None, :], mask=in_win[:, None], other=0.0)
    v = tl.load(win_v + (row * stride_wvt + kvh * stride_wvh)[:, None] + d[None, :], mask=in_win[:, None], other=0.0)
    return p, in_win, k, v


@triton.jit
def _cache_tile(start, bt_row, k_head, v_head, log_k, log_v, lg_lo, lg_hi, lg_row0, kvh, ks, vs, ring_slots,
                stride_kb, stride_ks, stride_vb, stride_vs, stride_lkt, stride_lkh, stride_lvt, stride_lvh, d,
                dtype: tl.constexpr, BS: tl.constexpr, BLOCK_N: tl.constexpr, RING: tl.constexpr,
                HAS_LOG: tl.constexpr, FP8: tl.constexpr, UPCAST: tl.constexpr):
    """One key tile wholly inside the paged cache: positions p `[N]` and their K/V `[N, D]` through the
    block table (ring index, log rows and fp8 scales as the kernel's flags say; no bounds mask)."""
    p = start + tl.arange(0, BLOCK_N)
    if RING:
        ri = p % ring_slots
    else:
        ri = p
    blk = tl.load(bt_row + ri // BS).to(tl.int64)
    off = (ri % BS).to(tl.int64)
    k_at = k_head + (blk * stride_kb + off * stride_ks)
    v_at = v_head + (blk * stride_vb + off * stride_vs)
    if HAS_LOG:    # a pointer select: log rows have the cache's dtype
        in_log = (p >= lg_lo) & (p < lg_hi)
        lrow = (lg_row0 + p - lg_lo).to(tl.int64)
        k_at = tl.where(in_log, log_k + (lrow * stride_lkt + kvh * stride_lkh), k_at)
        v_at = tl.where(in_log, log_v + (lrow * stride_lvt + kvh * stride_lvh), v_at)
    k = tl.load(k_at[:, None] + d[None, :])
    v = tl.load(v_at[:, None] + d[None, :])
    if FP8:    # as cache.gather: float * scale, rounded to the model dtype
        k = _cast(k.to(tl.float32) * ks, dtype, UPCAST)
        v = _cast(v.to(tl.float32) * vs, dtype, UPCAST)
    return p, k, v


@triton.jit
def _verify_attention_kernel(
        q_ptr, k_cache, v_cache, block_tables, cache_lens, query_start_loc, positions,
        win_k, win_v, win_rows, win_start, k_scale, v_scale, out_ptr, part_o, part_lse,
        log_k, log_v, log_lo, log_start, tree_lo,
        qk_scale, keys_per_split, win_size, ring_slots,
        stride_qt, stride_qh, stride_ot, stride_oh,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
        stride_wkt, stride_wkh, stride_wvt, stride_wvh,
        stride_lkt, stride_lkh, stride_lvt, stride_lvh,
        stride_ps, stride_pt, stride_ph,
        GROUP: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        HAS_WINDOW: tl.constexpr, FP8: tl.constexpr, FP8_MANT: tl.constexpr, FP8_EMIN: tl.constexpr,
        FP8_MAX: tl.constexpr, SPLIT: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
        ROW_LOOP: tl.constexpr, SLIDING: tl.constexpr, RING: tl.constexpr, HAS_LOG: tl.constexpr,
        SPLIT_TAIL: tl.constexpr, TREE: tl.constexpr):
    req = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)
    dtype = q_ptr.dtype.element_ty

    q_start, q_rows, cache_len, w_start, w_len = _request_keys(query_start_loc, cache_lens, win_start, req, GROUP,
                                                               HAS_WINDOW)
    if TREE:
        # the keys below the request's tree (tree_lo); the tree's rows are _tree_window_kernel's
        cache_len = tl.minimum(cache_len, tl.load(tree_lo + req))
    n_keys = cache_len + w_len
    if SLIDING:
        # tiles wholly below the window of the request's first (lowest) query hold no visible key
        first = tl.load(positions + q_start, mask=q_rows > 0, other=0).to(tl.int32)
        base = tl.maximum(first - win_size + 1, 0) // BLOCK_N * BLOCK_N
    else:
        base = 0
    if HAS_LOG:
        # positions lg_lo .. lg_hi - 1 are read from the log rows lg_row0 .. (what the window's
        # draft writes evicted from the ring, saved by cow before they were overwritten)
        lg_lo = tl.load(log_lo + req)
        lg_row0 = tl.load(log_start + req)
        lg_hi = lg_lo + (tl.load(log_start + req + 1) - lg_row0)
    else:              # unused (the tile helper takes them either way)
        lg_lo = 0
        lg_row0 = 0
        lg_hi = 0
    # this split's keys; the last split runs to the end, so the window and any cache the split
    # plan did not foresee are always covered
    lo = base + split * keys_per_split
    hi = tl.where(split == num_splits - 1, n_keys, tl.minimum(lo + keys_per_split, n_keys))
    ks, vs = _kv_scales(k_scale, v_scale, kvh, FP8)

    d = tl.arange(0, D)
    bt_row = block_tables + req.to(tl.int64) * stride_bt
    k_head = k_cache + kvh.to(tl.int64) * stride_kh
    v_head = v_cache + kvh.to(tl.int64) * stride_vh
    # more query rows than one tile holds (long prefill-like requests): walk them in tiles.
    # ROW_LOOP False (the host knows every request fits one tile) compiles the walk away: the
    # loop around the key loops costs registers.
    if ROW_LOOP:
        m_end = q_rows
    else:
        m_end = 1
    for m0 in range(0, m_end, BLOCK_M):
        row_ok, tok, head, q, pos = _query_tile(q_ptr, positions, q_start, m0, q_rows, kvh, stride_qt, stride_qh, d,
                                                GROUP, BLOCK_M)
        # keys past the last query's position are masked for every row: do not read them
        end = tl.minimum(hi, tl.max(pos, 0) + 1)
        full_end = lo + tl.maximum(tl.minimum(end, cache_len) - lo, 0) // BLOCK_N * BLOCK_N

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        # tiles wholly inside the paged cache
        for start in range(lo, full_end, BLOCK_N):
            p, k, v = _cache_tile(start, bt_row, k_head, v_head, log_k, log_v, lg_lo, lg_hi, lg_row0, kvh, ks, vs,
                                  ring_slots, stride_kb, stride_ks, stride_vb, stride_vs, stride_lkt, stride_lkh,
                                  stride_lvt, stride_lvh, d, dtype, BS, BLOCK_N, RING, HAS_LOG, FP8, UPCAST)
            visible = p[None, :] <= pos[:, None]
            if SLIDING:
                visible = visible & (p[None, :] > pos[:, None] - win_size)
            m_i, l_i, acc = _softmax_step(q, k, v, visible, m_i, l_i, acc, qk_scale, IEEE, UPCAST)
        # tail tiles: the cache's last partial tile and the window rows, masked per position. With a
        # window (not fp8) and SPLIT_TAIL, only the tile holding cache_len mixes the two sources;
        # the tiles past it read the window rows alone (no block-table load, no source select).
        # Same tiles, same values, same order of reduction either way.
        if HAS_WINDOW and not FP8 and SPLIT_TAIL:
            mix_end = tl.minimum(end, tl.maximum(full_end, (cache_len + BLOCK_N - 1) // BLOCK_N * BLOCK_N))
        else:
            mix_end = end
        for start in range(full_end, mix_end, BLOCK_N):
            p = start + tl.arange(0, BLOCK_N)
            in_cache = p < cache_len
            if RING:
                ri = p % ring_slots
            else:
                ri = p
            blk = tl.load(bt_row + ri // BS, mask=in_cache, other=0).to(tl.int64)
            off = (ri % BS).to(tl.int64)
            k_at = k_head + (blk * stride_kb + off * stride_ks)
            v_at = v_head + (blk * stride_vb + off * stride_vs)
            if HAS_LOG:
                in_log = (p >= lg_lo) & (p < lg_hi)
                lrow = (lg_row0 + p - lg_lo).to(tl.int64)
                k_at = tl.where(in_log, log_k + (lrow * stride_lkt + kvh * stride_lkh), k_at)
                v_at = tl.where(in_log, log_v + (lrow * stride_lvt + kvh * stride_lvh), v_at)
            if HAS_WINDOW and not FP8:
                # one load per row from whichever source holds it (a pointer select): loading
                # both sources and blending them kept two K/V tiles live, and the extra
                # registers slowed every tile of the kernel, not just this one
                in_win = (p >= cache_len) & (p < end)
                row = tl.load(win_rows + w_start + (p - cache_len), mask=in_win, other=0).to(tl.int64)
                k_rows = tl.where(in_cache, k_at, win_k + (row * stride_wkt + kvh * stride_wkh))
                v_rows = tl.where(in_cache, v_at, win_v + (row * stride_wvt + kvh * stride_wvh))
                some = (in_cache | in_win)[:, None]
                k = tl.load(k_rows[:, None] + d[None, :], mask=some, other=0.0)
                v = tl.load(v_rows[:, None] + d[None, :], mask=some, other=0.0)
            else:
                k = tl.load(k_at[:, None] + d[None, :], mask=in_cache[:, None], other=0.0)
                v = tl.load(v_at[:, None] + d[None, :], mask=in_cache[:, None], other=0.0)
                if FP8:
                    k = _cast(k.to(tl.float32) * ks, dtype, UPCAST)
                    v = _cast(v.to(tl.float32) * vs, dtype, UPCAST)
                if HAS_WINDOW:
                    in_win = (p >= cache_len) & (p < end)
                    row = tl.load(win_rows + w_start + (p - cache_len), mask=in_win, other=0).to(tl.int64)
                    wk = tl.load(win_k + (row * stride_wkt + kvh * stride_wkh)[:, None] + d[None, :],
                                 mask=in_win[:, None], other=0.0)
                    wv = tl.load(win_v + (row * stride_wvt + kvh * stride_wvh)[:, None] + d[None, :],
                                 mask=in_win[:, None], other=0.0)
                    if FP8:    # the window as the cache would hand it back after a write
                        wk = _fp8_roundtrip(wk, ks, dtype, FP8_MANT, FP8_EMIN, FP8_MAX, UPCAST)
                        wv = _fp8_roundtrip(wv, vs, dtype, FP8_MANT, FP8_EMIN, FP8_MAX, UPCAST)
                    k = tl.where(in_win[:, None], wk, k)
                    v = tl.where(in_win[:, None], wv, v)
            visible = (p[None, :] <= pos[:, None]) & (p < end)[None, :]
            if SLIDING:
                visible = visible & (p[None, :] > pos[:, None] - win_size)
            m_i, l_i, acc = _softmax_step(q, k, v, visible, m_i, l_i, acc, qk_scale, IEEE, UPCAST)

        if HAS_WINDOW and not FP8 and SPLIT_TAIL:
            for start in range(mix_end, end, BLOCK_N):               # p >= cache_len on these tiles
                p, in_win, k, v = _window_tile(start, end, cache_len, w_start, win_k, win_v, win_rows, kvh,
                                               stride_wkt, stride_wkh, stride_wvt, stride_wvh, d, BLOCK_N)
                visible = (p[None, :] <= pos[:, None]) & in_win[None, :]
                if SLIDING:
                    visible = visible & (p[None, :] > pos[:, None] - win_size)
                m_i, l_i, acc = _softmax_step(q, k, v, visible, m_i, l_i, acc, qk_scale, IEEE, UPCAST)

        o = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]     # no visible key: 0, not NaN
        if SPLIT:
            lse = tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(tl.where(l_i == 0.0, 1.0, l_i)))
            at = split.to(tl.int64) * stride_ps + tok * stride_pt + head * stride_ph
            tl.store(part_o + at[:, None] + d[None, :], o, mask=row_ok[:, None])
            tl.store(part_lse + at // D, lse, mask=row_ok)   # part_lse: part_o less its D axis
        else:
            tl.store(out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
                     _cast(o, dtype, UPCAST), mask=row_ok[:, None])


@triton.jit
def _tree_window_keys(q, pos, tok, row_ok, m_i, l_i, acc, k_lo, n_keys, cache_len, w_start, t_lo, kvh, ks, vs,
                      win_k, win_v, win_rows, tree_mask, stride_tm, tree_words, qk_scale, win_size,
                      stride_wkt, stride_wkh, stride_wvt, stride_wvh, d, dtype: tl.constexpr,
                      BLOCK_N: tl.constexpr, FP8: tl.constexpr, FP8_MANT: tl.constexpr, FP8_EMIN: tl.constexpr,
                      FP8_MAX: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr, SLIDING: tl.constexpr):
    """The tree kernel's keys k_lo .. n_keys - 1, all of them window rows (stage's tree)."""
    for start in range(k_lo, n_keys, BLOCK_N):
        p, in_win, k, v = _window_tile(start, n_keys, cache_len, w_start, win_k, win_v, win_rows, kvh,
                                       stride_wkt, stride_wkh, stride_wvt, stride_wvh, d, BLOCK_N)
        if FP8:                     # the window as the cache would hand it back
            k = _fp8_roundtrip(k, ks, dtype, FP8_MANT, FP8_EMIN, FP8_MAX, UPCAST)
            v = _fp8_roundtrip(v, vs, dtype, FP8_MANT, FP8_EMIN, FP8_MAX, UPCAST)
        visible = p[None, :] <= pos[:, None]
        if SLIDING:
            visible = visible & (p[None, :] > pos[:, None] - win_size)
        visible = _tree_visible(visible, start, p, tok, row_ok, tree_mask, stride_tm, t_lo, tree_words, BLOCK_N) & \
            in_win[None, :]
        m_i, l_i, acc = _softmax_step(q, k, v, visible, m_i, l_i, acc, qk_scale, IEEE, UPCAST)
    return m_i, l_i, acc


@triton.jit
def _tree_window_kernel(
        q_ptr, k_cache, v_cache, block_tables, cache_lens, query_start_loc, positions,
        win_k, win_v, win_rows, win_start, k_scale, v_scale, out_ptr, part_o, part_lse, num_splits,
        tree_mask, tree_lo, stride_tm, tree_words, qk_scale, win_size,
        stride_qt, stride_qh, stride_ot, stride_oh,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
        stride_wkt, stride_wkh, stride_wvt, stride_wvh,
        stride_ps, stride_pt, stride_ph,
        GROUP: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        HAS_WINDOW: tl.constexpr, FP8: tl.constexpr, FP8_MANT: tl.constexpr, FP8_EMIN: tl.constexpr,
        FP8_MAX: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr, SLIDING: tl.constexpr):
    """A pass over tree windows, second half: each query row attends the request's keys from
    min(cache_len, tree_lo) on (the tree's rows by their ancestor bits, any key below tree_lo by the
    position rule): with a window source its rows (every tree row is a window row: tree_lo >=
    cache_len, checked by verify_attention), else the cache's; then merges that with the partials
    the cache kernel left for the keys below (`part_o` / `part_lse`, `num_splits` of them) and writes
    the row.

    Grid (request, KV head, row tile); a program walks the request's rows from its tile in strides of
    the grid's row tiles, so a bound on the rows that was too small costs time, never rows."""
    req = tl.program_id(0)
    kvh = tl.program_id(1)
    mt = tl.program_id(2)
    n_mt = tl.num_programs(2)
    dtype = q_ptr.dtype.element_ty
    q_start, q_rows, cache_len, w_start, w_len = _request_keys(query_start_loc, cache_lens, win_start, req, GROUP,
                                                               HAS_WINDOW)
    n_keys = cache_len + w_len
    t_lo = tl.load(tree_lo + req)
    k_lo = tl.minimum(cache_len, t_lo)
    ks, vs = _kv_scales(k_scale, v_scale, kvh, FP8)
    d = tl.arange(0, D)
    bt_row = block_tables + req.to(tl.int64) * stride_bt
    k_head = k_cache + kvh.to(tl.int64) * stride_kh
    v_head = v_cache + kvh.to(tl.int64) * stride_vh
    for m0 in range(mt * BLOCK_M, q_rows, n_mt * BLOCK_M):
        row_ok, tok, head, q, pos = _query_tile(q_ptr, positions, q_start, m0, q_rows, kvh, stride_qt, stride_qh, d,
                                                GROUP, BLOCK_M)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        # the same tiles (from k_lo) whichever source holds the tree, so stage's tree gives write-all's
        # bits. With a window source every tree row is a window row (verify_attention checks tree_lo >=
        # cache_lens): its keys are window rows alone, read with no block-table lookup and no source
        # select (compiled apart: with both sources in the loop stage's tree kernel ran 2-15 % slower)
        if HAS_WINDOW:
            m_i, l_i, acc = _tree_window_keys(
                q, pos, tok, row_ok, m_i, l_i, acc, cache_len, n_keys, cache_len, w_start, t_lo, kvh, ks, vs,
                win_k, win_v, win_rows, tree_mask, stride_tm, tree_words, qk_scale, win_size,
                stride_wkt, stride_wkh, stride_wvt, stride_wvh, d, dtype, BLOCK_N, FP8, FP8_MANT, FP8_EMIN,
                FP8_MAX, IEEE, UPCAST, SLIDING)
        else:
            for start in range(k_lo, n_keys, BLOCK_N):
                p = start + tl.arange(0, BLOCK_N)
                in_cache = p < n_keys
                blk = tl.load(bt_row + p // BS, mask=in_cache, other=0).to(tl.int64)
                off = (p % BS).to(tl.int64)
                k = tl.load(k_head + (blk * stride_kb + off * stride_ks)[:, None] + d[None, :],
                            mask=in_cache[:, None], other=0.0)
                v = tl.load(v_head + (blk * stride_vb + off * stride_vs)[:, None] + d[None, :],
                            mask=in_cache[:, None], other=0.0)
                if FP8:
                    k = _cast(k.to(tl.float32) * ks, dtype, UPCAST)
                    v = _cast(v.to(tl.float32) * vs, dtype, UPCAST)
                visible = p[None, :] <= pos[:, None]
                if SLIDING:
                    visible = visible & (p[None, :] > pos[:, None] - win_size)
                visible = _tree_visible(visible, start, p, tok, row_ok, tree_mask, stride_tm, t_lo, tree_words, BLOCK_N) & \
                    (p < n_keys)[None, :]
                m_i, l_i, acc = _softmax_step(q, k, v, visible, m_i, l_i, acc, qk_scale, IEEE, UPCAST)
        # merge with the cache kernel's partials (normalised o_s, base-2 lse_s): the largest lse first,
        # then sum_s 2^(lse_s - top) o_s + 2^(m - top) acc over sum_s 2^(lse_s - top) + 2^(m - top) l
        # (offsets carried in int64: split x stride may pass 2^31)
        row_at = tok * stride_pt + head * stride_ph
        top = m_i
        at = row_at
        for _ in range(0, num_splits):
            top = tl.maximum(top, tl.load(part_lse + at // D, mask=row_ok, other=float("-inf")))
            at += stride_ps
        top = tl.where(top == float("-inf"), 0.0, top)     # no visible key anywhere: 0 / 0 -> 0 below
        w = tl.exp2(m_i - top)
        num = acc * w[:, None]
        den = l_i * w
        at = row_at
        for _ in range(0, num_splits):
            w = tl.exp2(tl.load(part_lse + at // D, mask=row_ok, other=float("-inf")) - top)
            num += w[:, None] * tl.load(part_o + at[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
            den += w
            at += stride_ps
        o = num / tl.where(den == 0.0, 1.0, den)[:, None]
        tl.store(out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
                 _cast(o, dtype, UPCAST), mask=row_ok[:, None])


@triton.jit
def _merge_splits_kernel(part_o, part_lse, out_ptr, num_splits, stride_ps, stride_pt, stride_ph,
                         stride_ot, stride_oh, D: tl.constexpr, SPLITS: tl.constexpr, FIX_BF16: tl.constexpr):
    """out[t, h] = sum_s 2^(lse_s - max) o_s / sum_s 2^(lse_s - max)."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, SPLITS)
    d = tl.arange(0, D)
    at = s.to(tl.int64) * stride_ps + t * stride_pt + h * stride_ph
    lse = tl.load(part_lse + at // D, mask=s < num_splits, other=float("-inf"))
    top = tl.max(lse, 0)
    w = tl.exp2(lse - tl.where(top == float("-inf"), 0.0, top))
    o = tl.load(part_o + at[:, None] + d[None, :], mask=(s < num_splits)[:, None], other=0.0)
    total = tl.sum(w, 0)
    merged = tl.sum(w[:, None] * o, 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + d, _cast(merged, out_ptr.dtype.element_ty, FIX_BF16))


INTERPRETED = type(_verify_attention_kernel).__name__ == "InterpretedFunction"

# Launch plan. The sweep of `nwor_lab.bench.attention --tune` on an H100 (torch 2.11, triton 3.6;
# benchmarks/results/verify_attention_h100.json) picked 64 keys a tile, 4 warps, 3 stages: 93.9 % /
# 88.2 % of copy bandwidth at batch 64 x 4096 keys with 1 / 16 queries. 8 warps, or 128-key tiles,
# lost 10-38 %; twice the splits lost 1-8 %; compiling the row loop out (row_loop=False) won 4 % at
# 16 queries and lost 12 % at one, so the loop stays unless T alone proves one tile suffices.
BLOCK_N = 64
NUM_WARPS = 4
NUM_STAGES = 3
PROGRAMS_PER_SM = 2      # split the key range until the grid has this many programs per SM
MIN_KEYS_PER_SPLIT = 256
# Window tiles past the cache in a loop of their own (the kernel's tail) measured SLOWER on an H100:
# window/cache 1.13 / 1.08 / 1.04 at batch 1 / 16 / 64 with the split, 1.03 / 1.03 / 1.00 with one
# tail loop (benchmarks/results/verify_attention_variants_h100.json, the 8B layer, 5-token windows):
# the extra loop costs registers and instructions in every program. Kept as a knob, off.
SPLIT_TAIL = False
# Launch of `_tree_window_kernel` (a tree pass's own rows, both strategies): a request's N + 1 tokens
# x GROUP query rows against its N + 1 tree keys, then the merge. block_m 0: 32 query rows a program
# while the pass has fewer than TREE_BLOCK_M64_ROWS query rows x KV heads, 64 from there. On an H200
# (8B shape, context 1024, N = 16/32/64, batch 1/8/32; benchmarks/results/tree_window_launch/
# two_kernels_*_h200.json) 32 rows won at batch 1 (0.26-0.35 ms a step against 0.33-0.46) and at
# batch 8 with N = 16, 64 rows everywhere above (3.1 against 3.9 ms at batch 32, N = 64); 8 warps
# lost. For tuning runs, NWOR_LAB_TREE_WINDOW_LAUNCH="num_warps=8,block_m=64" sets them
# (tests/gpu/tree_attention_run.sh).
TREE_WINDOW: dict = {"num_warps": 4, "num_stages": 1, "block_m": 0, "block_n": 64}
TREE_BLOCK_M64_ROWS = 8192


def _knobs_from_env(text: str) -> dict:
    out = {}
    for part in filter(None, (x.strip() for x in text.split(","))):
        name, _, value = part.partition("=")
        if name not in TREE_WINDOW:
            raise ValueError(f"NWOR_LAB_TREE_WINDOW_LAUNCH: unknown knob {name!r} ({', '.join(TREE_WINDOW)})")
        out[name] = int(value)
    if not 16 <= out.get("block_n", 64) <= 64:
        raise ValueError(f"NWOR_LAB_TREE_WINDOW_LAUNCH: block_n={out['block_n']} must be 16 .. 64 (a tree key tile "
                         f"reads at most two ancestor words)")
    return out


TREE_WINDOW.update(_knobs_from_env(os.environ.get("NWOR_LAB_TREE_WINDOW_LAUNCH", "")))


_SM_COUNT: dict = {}


def sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4                       # the interpreter: small, so CPU tests exercise splits
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def plan_splits(num_reqs: int, num_kv_heads: int, max_cache_keys: int, device, block_n: int) -> tuple[int, int]:
    """(num_splits, keys_per_split) from shapes only (no device sync, CUDA-graph safe).

    `max_cache_keys` is the block tables' capacity (max_blocks * block_size), an upper bound on
    every cache_len. Split only when requests x KV heads leave SMs idle, and never below
    MIN_KEYS_PER_SPLIT keys a split (the merge and the partial writes must stay small).
    """
    want = -(-PROGRAMS_PER_SM * sm_count(torch.device(device)) // max(1, num_reqs * num_kv_heads))
    most = max(1, max_cache_keys // max(MIN_KEYS_PER_SPLIT, block_n))
    splits = max(1, min(want, most))
    per = -(-max(1, max_cache_keys) // splits)
    per = -(-per // block_n) * block_n                 # tiles stay aligned to position 0
    return -(-max(1, max_cache_keys) // per), per


def launch(q, key_cache, value_cache, block_tables, cache_lens, query_start_loc, positions,
           win_key, win_value, win_rows, win_start, k_scale, v_scale, scale, out, *,
           sliding_window=0, ring_slots=0, log_key=None, log_value=None, log_lo=None, log_start=None,
           tree_mask=None, tree_lo=None, max_query_len=0, num_splits=None, block_n=None, num_warps=None,
           num_stages=None, row_loop=None,
           block_m=None, split_tail=None):
    """Run the kernels on checked arguments (see verify_attention); tuning knobs for the bench.

    max_query_len: the caller's host bound on every request's query rows (0: unknown).
    block_m / row_loop / split_tail: force the query tile, the row walk and the window tail's
    split (the kernel before the split: block_m=64, row_loop=True, split_tail=False at batch > 1).
    _tree_window_kernel (a tree pass) launches with TREE_WINDOW's knobs.
    """
    T, hq, d = q.shape
    nb, bs, h, _ = key_cache.shape
    num_reqs = block_tables.shape[0]
    group = hq // h
    block_n = block_n or BLOCK_N
    max_cache_keys = block_tables.shape[1] * bs
    if sliding_window:
        # a request reads at most W keys before its first query, its rows and one tile of alignment
        # (the last split runs to the end, so this bounds the work, never what is read)
        max_cache_keys = sliding_window + block_n + 16
    if num_splits is None:
        num_splits, per_split = plan_splits(num_reqs, h, max_cache_keys, q.device, block_n)
    else:
        per_split = -(-max(1, -(-max_cache_keys // num_splits)) // block_n) * block_n
    # Query tile: the rows of the longest request, bounded without a sync: the caller's
    # max_query_len (the engine knows its windows: 1 + k), else T - R + 1 (if every request has
    # a token, none has more). Verify windows have at most 16 tokens. A request with more rows
    # than the tile is still right (the kernel walks its rows tile by tile, re-reading K/V).
    # A tight tile matters: at batch >= 2 the T - R + 1 bound gave 5-token windows a 64-row tile
    # (3x the MMA work, a row walk, more registers), where the caller's bound gives 32, no walk.
    bound = max_query_len if max_query_len else max(1, T - num_reqs + 1)
    if block_m is None:
        block_m = max(16, min(128, triton.next_power_of_2(min(16, bound) * group)))
    if row_loop is None:
        row_loop = bound * group > block_m
    if split_tail is None:
        split_tail = SPLIT_TAIL
    fp8 = key_cache.dtype in FP8_FORMATS
    mant, emin, fmax = FP8_FORMATS.get(key_cache.dtype, (0, 0, 0.0))
    tree = tree_mask is not None
    # a tree pass: this kernel reads the keys below each request's tree from the cache alone and
    # always leaves partials; _tree_window_kernel reads the tree's rows and merges
    has_window = win_key is not None and not tree
    has_log = log_key is not None
    split = num_splits > 1 or tree
    if split:
        part_o = torch.empty((num_splits, T, hq, d), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((num_splits, T, hq), dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = out       # unused
    dummy_idx = cache_lens
    ieee, upcast = q.dtype == torch.float32, INTERPRETED and q.dtype == torch.bfloat16
    grid = (num_reqs, h, num_splits)
    _verify_attention_kernel[grid](
        q, key_cache, value_cache, block_tables, cache_lens, query_start_loc, positions,
        win_key if has_window else q, win_value if has_window else q,
        win_rows if has_window else dummy_idx, win_start if has_window else dummy_idx,
        k_scale if fp8 else q, v_scale if fp8 else q, out, part_o, part_lse,
        log_key if has_log else key_cache, log_value if has_log else value_cache,
        log_lo if has_log else dummy_idx, log_start if has_log else dummy_idx,
        tree_lo if tree else dummy_idx,
        float(scale) * LOG2E, per_split, int(sliding_window), int(ring_slots),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2), block_tables.stride(0),
        win_key.stride(0) if has_window else 0, win_key.stride(1) if has_window else 0,
        win_value.stride(0) if has_window else 0, win_value.stride(1) if has_window else 0,
        log_key.stride(0) if has_log else 0, log_key.stride(1) if has_log else 0,
        log_value.stride(0) if has_log else 0, log_value.stride(1) if has_log else 0,
        part_o.stride(0) if split else 0, part_o.stride(1) if split else 0, part_o.stride(2) if split else 0,
        GROUP=group, D=d, BS=bs, BLOCK_M=block_m, BLOCK_N=block_n,
        HAS_WINDOW=has_window, FP8=fp8, FP8_MANT=mant, FP8_EMIN=emin, FP8_MAX=fmax,
        SPLIT=split, IEEE=ieee, UPCAST=upcast,
        ROW_LOOP=row_loop, SLIDING=bool(sliding_window), RING=bool(ring_slots), HAS_LOG=has_log,
        SPLIT_TAIL=bool(split_tail), TREE=tree, num_warps=num_warps or NUM_WARPS, num_stages=num_stages or NUM_STAGES)
    if tree:
        tree_window = win_key is not None
        tree_m = TREE_WINDOW["block_m"] or (64 if num_reqs * hq * bound >= TREE_BLOCK_M64_ROWS else 32)
        row_tiles = max(1, -(-bound * group // tree_m))
        _tree_window_kernel[(num_reqs, h, row_tiles)](
            q, key_cache, value_cache, block_tables, cache_lens, query_start_loc, positions,
            win_key if tree_window else q, win_value if tree_window else q,
            win_rows if tree_window else dummy_idx, win_start if tree_window else dummy_idx,
            k_scale if fp8 else q, v_scale if fp8 else q, out, part_o, part_lse, num_splits,
            tree_mask, tree_lo, tree_mask.stride(0), tree_mask.shape[1], float(scale) * LOG2E, int(sliding_window),
            q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
            value_cache.stride(0), value_cache.stride(1), value_cache.stride(2), block_tables.stride(0),
            win_key.stride(0) if tree_window else 0, win_key.stride(1) if tree_window else 0,
            win_value.stride(0) if tree_window else 0, win_value.stride(1) if tree_window else 0,
            part_o.stride(0), part_o.stride(1), part_o.stride(2),
            GROUP=group, D=d, BS=bs, BLOCK_M=tree_m, BLOCK_N=TREE_WINDOW["block_n"],
            HAS_WINDOW=tree_window, FP8=fp8, FP8_MANT=mant, FP8_EMIN=emin, FP8_MAX=fmax,
            IEEE=ieee, UPCAST=upcast, SLIDING=bool(sliding_window),
            num_warps=TREE_WINDOW["num_warps"], num_stages=TREE_WINDOW["num_stages"])
    elif split:
        _merge_splits_kernel[(T, hq)](
            part_o, part_lse, out, num_splits, part_o.stride(0), part_o.stride(1), part_o.stride(2),
            out.stride(0), out.stride(1), D=d, SPLITS=triton.next_power_of_2(num_splits),
            FIX_BF16=upcast, num_warps=1)
    return out


def fp8_round_trip_check(x: torch.Tensor, storage_dtype: torch.dtype, scale: float) -> torch.Tensor:
    """The kernel's window round trip on a 1-D fp32 tensor (length a power of two), for tests."""
    mant, emin, fmax = FP8_FORMATS[storage_dtype]
    out = torch.empty_like(x)
    _round_trip_kernel[(1,)](x, out, float(scale), N=x.numel(), MANT=mant, EMIN=emin, FMAX=fmax)
    return out


@triton.jit
def _round_trip_kernel(x_ptr, out_ptr, scale, N: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
                       FMAX: tl.constexpr):
    i = tl.arange(0, N)
    y = _fp8_roundtrip(tl.load(x_ptr + i), scale, tl.float32, MANT, EMIN, FMAX, False)
    tl.store(out_ptr + i, y)

