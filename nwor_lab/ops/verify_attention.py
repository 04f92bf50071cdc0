"""verify_attention: paged attention for a verify pass, every request in one launch (Triton).

    q               [T, Hq, D]      fp32/fp16/bf16; request r owns rows query_start_loc[r]:[r+1]
    key_cache, ...  [NB, BS, H, D]  one layer, logical NHD view of an NHD or HND cache, q's dtype
                                    or fp8 (e4m3fn / e5m2, with k_scale / v_scale float32 [H])
    block_tables    [R, max_blocks] int32: position p of request r is in block [r, p // BS], slot p % BS
    cache_lens      [R] int32       request r reads positions 0 .. cache_lens[r]-1 from the cache
    positions       [T] int32/64    query t attends key position p iff p <= positions[t]
    win_key, ...    [Tw, H, D]      optional window source (NWOR `stage`): request r's keys at
    win_rows        [n] int32/64      positions cache_lens[r] + j are rows
    win_start       [R+1] int32       win_key[win_rows[win_start[r] + j]], j < win_start[r+1] - win_start[r]
    sliding_window  int             W > 0: query t attends key p iff positions[t] - W < p <= positions[t]
                                      (each request's first query row holds its lowest position); 0: all
    ring_slots      int             S > 0: the cache is a ring, position p at ring index p mod S (block
                                      [r, (p mod S) // BS], offset (p mod S) % BS); needs W > 0, S >= W
    log_key, ...    [n, H, D]       optional log source (NWOR `cow` on a ring), the cache's dtype (raw
    log_lo          [R] int32         stored rows): request r's positions log_lo[r] + j, j < log_start[r+1]
    log_start       [R+1] int32       - log_start[r], come from log_key[log_start[r] + j], not the cache
    tree_mask       [T, words] int64 optional (a tree window, nwor_lab.speculative.tree_window): key index p >= tree_lo[r]
    tree_lo         [R] int32         (a row of the request's window: the cache's tail under write-all,
                                      the window source under stage) is visible to query t iff bit
                                      (p - tree_lo[r]) % 64 of tree_mask[t, (p - tree_lo[r]) // 64] is
                                      set (its ancestors and itself); keys below tree_lo[r] follow the
                                      position rule (positions[t] = n + depth). Not on a ring / log; with a
                                      sliding window every query's depth positions[t] - tree_lo[r] < W;
                                      with a window source tree_lo[r] >= cache_lens[r] (the tree's rows
                                      all in the window)
    max_query_len   int             a host bound on every request's query rows (0: unknown); sizes
                                      the kernel's query tile without a sync (a verify window: 1 + k)
    -> out          [T, Hq, D]      q's dtype; Hq // H query heads share a KV head (GQA)

An fp8 cache hands back `float(stored) * scale` rounded to q's dtype; window rows are put through
the same quantise-then-dequantise first, so `stage` attends to the numbers a cache read would give
(as `nwor_lab.model.attention.write_and_attend` does).

Design: ONE kernel reads both sources. A program owns (request, KV head, split of the key range)
and all of that request's q_len x group query rows, so each K/V tile is gathered once per KV head
and multiplied with tl.dot; the window rows are read in the tail tile(s) of the same key loop,
masked per position. The alternative, a partial attention over the cache and another over the
window merged by log-sum-exp, costs a second launch plus a round trip of fp32 partial outputs
(T x Hq x D, twice) for a handful of window keys per request, while in the single kernel those
keys ride in a tile that is read anyway. Measured on an H100 (benchmarks/results/
verify_attention_h100.json, batch 64 x 4096 keys, bf16): the last q_len + 3 keys from the window
cost 2-3 % more than the same keys from the cache (`window_vs_cache`), less than the partial
write, re-read and merge launch alone would. Key tiles are aligned to position 0, so a key tile
holds the same positions whichever source feeds it (stage and the committed window give the
same bits). A tree pass is the exception: its window is up to N + 1 rows with an ancestor
test per key, and in the one kernel that test and the window source spilled registers (stage's
tree attention 1.3-1.5x write-all's on an H200), so the keys below the tree leave partials and a
second kernel attends the tree's rows and merges (`_tree_window_kernel`, the same kernels and
tiles for both strategies, so again the same bits). A log-sum-exp merge does exist, but only to split long key ranges when requests x KV
heads are too few to fill the GPU (small batches); the split count comes from shapes alone (the
block tables' capacity), so a call never syncs with the device and can be captured in a CUDA graph.

Measured (same file): 88-94 % of the device's copy bandwidth reading bf16 KV at batch 64 x 4096
keys, 1-16 queries; 76-85 % at batch 64 x 1024. Known cost: with an fp8 cache AND the window
source, the window's in-kernel quantise-dequantise spills registers (1.4 KB of stack per thread
in the compiled kernel) and the call is 44 % slower than the fp8 cache alone; fp32 queries (IEEE
dot, no tensor cores) are a correctness path, not a fast one.

Backends: "triton" (CUDA tensors, or CPU tensors under Triton's interpreter, TRITON_INTERPRET=1
set before triton is imported) and "reference" (torch, per request: gather + SDPA with the mask).
Default: triton for CUDA tensors when triton imports, else the reference. triton is imported on
the first triton call, never with the package.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from nwor_lab._checks import FLOAT_DTYPES, INDEX_DTYPES, capturing, check_tensor
from nwor_lab.kv.cache import is_fp8
from nwor_lab.kv.layout import detect_layout
from nwor_lab.ops._lazy import LazyModule
from nwor_lab.ops.quant import dequantize, quantize, raw
from nwor_lab.ops.verify_attention_cases import VerifyAttentionCase, make_verify_attention_case

BACKENDS = ("triton", "reference")
WINDOW_ARGS = ("win_key", "win_value", "win_rows", "win_start")
LOG_ARGS = ("log_key", "log_value", "log_lo", "log_start")
TREE_ARGS = ("tree_mask", "tree_lo")
INSTALL_HINT = "install it with `pip install triton` (Linux), or use backend='reference'"

__all__ = ["verify_attention", "verify_attention_reference", "make_verify_attention_case",
           "VerifyAttentionCase", "triton_available"]

_kernels = LazyModule("nwor_lab.ops._verify_attention_triton")   # imported once a triton call needs it



def _all_or_none(source: str, names, tensors) -> bool:
    """True when every tensor of an extra source is given, False when none is; else a one-line error."""
    given = [t is not None for t in tensors]
    if any(given) and not all(given):
        missing = [n for n, g in zip(names, given) if not g]
        raise ValueError(f"{', '.join(missing)}: missing; a {source} source needs all of {', '.join(names)} "
                         f"(or none of them)")
    return all(given)


def _check_rows(prefix: str, key, value, heads_dims, dtype, dev, what: str) -> None:
    """An extra source's K/V rows: `[n, num_kv_heads, head_size]`, `dtype`, on `dev`, value as key,
    head_size contiguous."""
    check_tensor(f"{prefix}_key", key, ndim=3, dtypes=(dtype,), device=dev, what=what)
    if tuple(key.shape[1:]) != tuple(heads_dims):
        h, d = heads_dims
        raise ValueError(f"{prefix}_key: expected shape [*, {h}, {d}] (num_kv_heads, head_size of the cache), "
                         f"got {tuple(key.shape)}")
    check_tensor(f"{prefix}_value", value, shape=tuple(key.shape), dtypes=(dtype,), device=dev,
                 what=f"(same shape and dtype as {prefix}_key)")
    if key.stride(-1) != 1 or value.stride(-1) != 1:
        raise ValueError(f"{prefix}_key/{prefix}_value: head_size must be the contiguous dimension; "
                         f"call .contiguous()")

def _load_kernels():
    """The Triton kernel module, or raise with the reason and the install hint."""
    kernels = _kernels.get()
    if kernels is None:
        err = _kernels.error
        raise RuntimeError(f"backend='triton': triton could not be imported ({type(err).__name__}: "
                           f"{err}); {INSTALL_HINT}") from err
    return kernels


def triton_available() -> bool:
    """Whether the Triton kernels import here (imports triton on first call)."""
    try:
        _load_kernels()
        return True
    except RuntimeError:
        return False


def resolve_backend(backend: str | None, device: torch.device) -> str:
    """The backend a call on tensors on `device` uses (see the module docstring)."""
    if backend is None:
        return "triton" if device.type == "cuda" and triton_available() else "reference"
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: choose one of {', '.join(map(repr, BACKENDS))} "
                         f"(or None: triton on CUDA when it imports, else reference)")
    if backend == "triton":
        kernels = _load_kernels()
        if device.type != "cuda" and not kernels.INTERPRETED:
            raise ValueError(f"backend='triton': q is on {device}, and Triton runs CUDA tensors (or CPU "
                             f"tensors under its interpreter: set TRITON_INTERPRET=1 before triton is first "
                             f"imported); use backend='reference' or move the tensors to CUDA")
    return backend


# -- argument checks ---------------------------------------------------------------------------
def check_verify_args(q, key_cache, value_cache, block_tables, cache_lens, query_start_loc, positions,
                      win_key, win_value, win_rows, win_start, k_scale, v_scale, scale, out,
                      validate: bool = True, sliding_window: int = 0, ring_slots: int = 0,
                      log_key=None, log_value=None, log_lo=None, log_start=None, tree_mask=None,
                      tree_lo=None) -> None:
    """Raise, naming the argument and the fix, unless the call is well formed.

    validate: also check the index VALUES (offsets, lengths, block ids, window rows) on the host:
    one device sync on CUDA, skipped while a CUDA graph is being captured.
    """
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES, what="[num_tokens, num_q_heads, head_size]")
    T, hq, d = q.shape
    dev = q.device
    if q.stride(-1) != 1:
        raise ValueError("q: head_size must be the contiguous dimension; call q.contiguous()")
    check_tensor("key_cache", key_cache, ndim=4, device=dev,
                 what="[num_blocks, block_size, num_kv_heads, head_size] (one layer)")
    nb, bs, h, dk = key_cache.shape
    if dk != d:
        raise ValueError(f"key_cache: head_size {dk} differs from q's {d}; pass the cache of the layer q belongs to")
    if key_cache.dtype != q.dtype and not is_fp8(key_cache.dtype):
        raise TypeError(f"key_cache: dtype {key_cache.dtype} is neither q's dtype ({q.dtype}) nor fp8 "
                        f"(float8_e4m3fn / float8_e5m2 with k_scale and v_scale); cast q or the cache")
    check_tensor("value_cache", value_cache, shape=(nb, bs, h, d), dtypes=(key_cache.dtype,), device=dev,
                 what="(same shape and dtype as key_cache)")
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        try:
            detect_layout(cache)
        except ValueError as err:
            raise ValueError(f"{name}: {str(err).removeprefix('cache: ')}") from None
    if hq % h:
        raise ValueError(f"q: {hq} query heads is not a multiple of the cache's {h} KV heads (grouped-query "
                         f"attention shares each KV head among num_q_heads // num_kv_heads query heads)")
    check_tensor("block_tables", block_tables, ndim=2, dtypes=(torch.int32,), device=dev,
                 what="[num_reqs, max_blocks_per_req]")
    R = block_tables.shape[0]
    check_tensor("cache_lens", cache_lens, shape=(R,), dtypes=(torch.int32,), device=dev,
                 what="[num_reqs] (one per block_tables row): positions read from the cache")
    check_tensor("query_start_loc", query_start_loc, shape=(R + 1,), dtypes=INDEX_DTYPES, device=dev,
                 what="[num_reqs + 1]: offsets of each request's rows in q")
    check_tensor("positions", positions, shape=(T,), dtypes=INDEX_DTYPES, device=dev,
                 what="[num_tokens]: the position of each query token in its request")
    given = _all_or_none("window", WINDOW_ARGS, (win_key, win_value, win_rows, win_start))
    if given:
        _check_rows("win", win_key, win_value, (h, d), q.dtype, dev,
                    "[window_tokens, num_kv_heads, head_size] in q's dtype")
        check_tensor("win_rows", win_rows, ndim=1, dtypes=INDEX_DTYPES, device=dev,
                     what="[total window length]: rows of win_key, request by request")
        check_tensor("win_start", win_start, shape=(R + 1,), dtypes=(torch.int32,), device=dev,
                     what="[num_reqs + 1]: offsets of each request's window in win_rows")
    for name, v in (("sliding_window", sliding_window), ("ring_slots", ring_slots)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name}={v!r}: expected an int >= 0 (0: off)")
    if ring_slots and not 0 < sliding_window <= ring_slots:
        raise ValueError(f"ring_slots={ring_slots}: a ring keeps the last S positions, so it needs a sliding "
                         f"window of 1..S positions (sliding_window={sliding_window})")
    if _all_or_none("log", LOG_ARGS, (log_key, log_value, log_lo, log_start)):
        if given:
            raise ValueError("log_key and win_key: give one extra source (a log is read by cow on a ring, a "
                             "window buffer by stage), not both")
        if not ring_slots:
            raise ValueError("log_key: a log serves positions a ring write evicted; pass ring_slots (S > 0)")
        _check_rows("log", log_key, log_value, (h, d), key_cache.dtype, dev,
                    "[logged rows, num_kv_heads, head_size] in the cache's dtype")
        check_tensor("log_lo", log_lo, shape=(R,), dtypes=(torch.int32,), device=dev,
                     what="[num_reqs]: the first position each request reads from the log")
        check_tensor("log_start", log_start, shape=(R + 1,), dtypes=(torch.int32,), device=dev,
                     what="[num_reqs + 1]: offsets of each request's rows in log_key")
    tree = _all_or_none("tree", TREE_ARGS, (tree_mask, tree_lo))
    if tree:
        if ring_slots or log_key is not None:
            raise ValueError("tree_mask: a tree window on a ring cache is not supported (its write-all rows are "
                             "not in position order, and N nodes evict N positions); use a linear cache "
                             "(LabConfig.kv_ring='full') or a chain")
        check_tensor("tree_mask", tree_mask, ndim=2, dtypes=(torch.int64,), device=dev,
                     what="[num_tokens, words] int64 ancestor bits (nwor_lab.speculative.tree_window.TreeWindow.ancestors)")
        if tree_mask.shape[0] != T or tree_mask.stride(1) != 1:
            raise ValueError(f"tree_mask: expected [num_tokens={T}, words] with words contiguous, got shape "
                             f"{tuple(tree_mask.shape)}")
        check_tensor("tree_lo", tree_lo, shape=(R,), dtypes=(torch.int32,), device=dev,
                     what="[num_reqs]: the key index of each request's first window row")
    if is_fp8(key_cache.dtype):
        for name, sc in (("k_scale", k_scale), ("v_scale", v_scale)):
            if sc is None:
                raise ValueError(f"{name}: an fp8 cache needs float32 scales [num_kv_heads={h}]; "
                                 f"use PagedKVCache.layer_scales(layer)")
            check_tensor(name, sc, dtypes=(torch.float32,), device=dev)
            if sc.numel() not in (1, h):
                raise ValueError(f"{name}: expected [num_kv_heads={h}] (or one scalar), got shape {tuple(sc.shape)}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < float(scale) < float("inf"):
        raise ValueError(f"scale={scale!r}: the softmax scale must be a positive float (usually head_size ** -0.5)")
    if out is not None:
        check_tensor("out", out, shape=(T, hq, d), dtypes=(q.dtype,), device=dev, what="(q's shape and dtype)")
        if out.stride(-1) != 1:
            raise ValueError("out: head_size must be the contiguous dimension")
    if validate and not capturing():
        _check_values(T, nb, bs, block_tables, cache_lens, query_start_loc, positions,
                      win_key, win_rows, win_start, sliding_window, ring_slots, log_key, log_start)
        inside = (tree_lo.cpu() < cache_lens.cpu()).nonzero() if tree and win_key is not None else ()
        if len(inside):
            r = int(inside[0])
            raise ValueError(f"tree_lo: request {r}'s tree starts at key {int(tree_lo[r])}, inside its cache "
                             f"(cache_lens={int(cache_lens[r])}); with a window source every tree row must be a "
                             f"window row (tree_lo >= cache_lens): commit none of the tree before the pass, or "
                             f"pass no window and the whole tree in the cache")
        if tree and sliding_window and T:
            req = torch.repeat_interleave(torch.arange(R), query_start_loc.long().cpu().diff())
            depth = positions.long().cpu() - tree_lo.long().cpu()[req]
            if int(depth.max()) >= sliding_window:
                raise ValueError(f"tree_mask: a node of depth {int(depth.max())} with sliding_window="
                                 f"{sliding_window}: a tree deeper than the window would hide ancestors; "
                                 f"keep depth < W")


def _check_values(T, nb, bs, block_tables, cache_lens, query_start_loc, positions, win_key, win_rows,
                  win_start, sliding_window=0, ring_slots=0, log_key=None, log_start=None) -> None:
    """Offsets and indices in range; every query sees at least key 0."""
    qsl = query_start_loc.long().cpu()
    qlens = qsl.diff()
    if int(qsl[0]) != 0 or int(qsl[-1]) != T or bool((qlens < 0).any()):
        raise ValueError(f"query_start_loc: must rise from 0 to num_tokens={T}, got {qsl.tolist()[:8]}")
    lens = cache_lens.long().cpu()
    cap = block_tables.shape[1] * bs
    if ring_slots and ring_slots > cap:
        raise ValueError(f"ring_slots={ring_slots}: block_tables hold {cap} slots per request "
                         f"(block_tables.shape[1] x block_size); give each request ceil(S / BS) blocks")
    if bool((lens < 0).any()) or (not ring_slots and bool((lens > cap).any())):
        bad = lens[(lens < 0) | (lens > cap)][:4].tolist()
        raise ValueError(f"cache_lens: values {bad} are outside 0..{cap} (= block_tables.shape[1] x block_size)")
    need = -(-(lens.clamp(max=ring_slots) if ring_slots else lens) // bs)
    used = torch.arange(block_tables.shape[1])[None, :] < need[:, None]
    blocks = block_tables.cpu()[used]
    if blocks.numel() and (int(blocks.min()) < 0 or int(blocks.max()) >= nb):
        bad = blocks[(blocks < 0) | (blocks >= nb)][:4].tolist()
        raise ValueError(f"block_tables: block ids {bad} (in blocks that cache_lens reads) are outside "
                         f"0..{nb - 1} (key_cache.shape[0] - 1)")
    wlens = torch.zeros_like(lens)
    if win_start is not None:
        ws = win_start.long().cpu()
        wlens = ws.diff()
        if int(ws[0]) < 0 or int(ws[-1]) > win_rows.numel() or bool((wlens < 0).any()):
            raise ValueError(f"win_start: must rise from >= 0 to <= win_rows.numel()={win_rows.numel()}, "
                             f"got {ws.tolist()[:8]}")
        rows = win_rows[int(ws[0]):int(ws[-1])].cpu()
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= win_key.shape[0]):
            raise ValueError(f"win_rows: rows must be in 0..{win_key.shape[0] - 1} (win_key.shape[0] - 1)")
    if T and int(positions.min()) < 0:
        raise ValueError("positions: must be >= 0 (a query at position p sees keys 0..p)")
    if sliding_window and T:
        pos = positions.long().cpu()
        for r in range(len(qlens)):
            a, b = int(qsl[r]), int(qsl[r + 1])
            if b > a and int(pos[a]) != int(pos[a:b].min()):
                raise ValueError(f"positions: request {r}'s first query row is not its lowest position; with a "
                                 f"sliding window the kernel starts reading at that row's window")
    if log_start is not None:
        ls = log_start.long().cpu()
        if int(ls[0]) < 0 or int(ls[-1]) > log_key.shape[0] or bool((ls.diff() < 0).any()):
            raise ValueError(f"log_start: must rise from >= 0 to <= log_key.shape[0]={log_key.shape[0]}, "
                             f"got {ls.tolist()[:8]}")
    empty = (qlens > 0) & (lens + wlens == 0)
    if bool(empty.any()):
        r = int(empty.nonzero()[0])
        raise ValueError(f"cache_lens: request {r} has query tokens but no keys (cache_lens[{r}] = 0 and no "
                         f"window rows); a query attends at least to itself")


# -- the two implementations -------------------------------------------------------------------
def verify_attention_reference(q, key_cache, value_cache, block_tables, cache_lens, query_start_loc,
                               positions, *, win_key=None, win_value=None, win_rows=None, win_start=None,
                               k_scale=None, v_scale=None, scale, out=None, backend=None,
                               sliding_window: int = 0, ring_slots: int = 0, log_key=None, log_value=None,
                               log_lo=None, log_start=None, tree_mask=None, tree_lo=None,
                               trusted: bool = False) -> torch.Tensor:
    """The obviously right version (torch, any device): per request, gather its keys from the
    cache (dequantised as `PagedKVCache.gather` does; positions of the log range from the log)
    and its window rows (round-tripped through the cache dtype as `write_and_attend` does), then
    SDPA with the position mask. `backend` is accepted for a drop-in signature and ignored."""
    if not trusted:
        check_verify_args(q, key_cache, value_cache, block_tables, cache_lens, query_start_loc, positions,
                          win_key, win_value, win_rows, win_start, k_scale, v_scale, scale, out,
                          sliding_window=sliding_window, ring_slots=ring_slots, log_key=log_key,
                          log_value=log_value, log_lo=log_lo, log_start=log_start, tree_mask=tree_mask,
                          tree_lo=tree_lo)
    T, hq, d = q.shape
    bs, h = key_cache.shape[1], key_cache.shape[2]
    groups = hq // h
    if out is None:
        out = torch.empty((T, hq, d), dtype=q.dtype, device=q.device)
    fp8 = is_fp8(key_cache.dtype)
    wk, wv = win_key, win_value
    if win_key is not None and fp8:
        wk = dequantize(quantize(win_key, key_cache.dtype, k_scale), q.dtype, k_scale)
        wv = dequantize(quantize(win_value, value_cache.dtype, v_scale), q.dtype, v_scale)
    qsl = query_start_loc.tolist()
    lens = cache_lens.tolist()
    ws = win_start.tolist() if win_start is not None else None
    logs = (log_lo.tolist(), log_start.tolist()) if log_key is not None else None
    for r, n in enumerate(lens):
        s, e = qsl[r], qsl[r + 1]
        if s == e:
            continue
        n_win = ws[r + 1] - ws[r] if ws is not None else 0
        lo, mask = request_mask(positions[s:e], n, n_win, sliding_window,
                                None if tree_mask is None else tree_mask[s:e],
                                None if tree_lo is None else int(tree_lo[r]))
        p = torch.arange(lo, n, device=q.device)                        # positions read from the cache
        ring = p % ring_slots if ring_slots else p
        blk, off = block_tables[r].long()[ring // bs], ring % bs
        stored_k, stored_v = key_cache[blk, off], value_cache[blk, off]  # [n - lo, H, D] as stored
        if logs is not None:
            first, (a, b) = logs[0][r], logs[1][r:r + 2]
            from_log = (p >= first) & (p < first + b - a)
            rows = (a + p[from_log] - first).long()
            stored_k, stored_v = stored_k.clone(), stored_v.clone()
            raw(stored_k)[from_log], raw(stored_v)[from_log] = raw(log_key)[rows], raw(log_value)[rows]
        keys = dequantize(stored_k, q.dtype, k_scale)
        values = dequantize(stored_v, q.dtype, v_scale)
        if ws is not None:
            rows = win_rows[ws[r]:ws[r + 1]].long()
            keys, values = torch.cat([keys, wk[rows]]), torch.cat([values, wv[rows]])
        keys = keys.repeat_interleave(groups, dim=1)                    # [n_r, Hq, D]
        values = values.repeat_interleave(groups, dim=1)
        o = F.scaled_dot_product_attention(q[s:e].transpose(0, 1), keys.transpose(0, 1),
                                           values.transpose(0, 1), attn_mask=mask, scale=scale)
        out[s:e] = o.transpose(0, 1)
    return out


def request_mask(positions: torch.Tensor, cache_len: int, n_win: int, sliding_window: int = 0,
                 tree_mask: torch.Tensor | None = None, tree_lo: int | None = None):
    """One request's keys and visibility, the one rule every reader of the metadata shares:
    positions `[q]` (its queries; the first holds the lowest), `cache_len` positions in the cache,
    `n_win` window rows after them. -> (lo, mask `[q, cache_len - lo + n_win]` bool): key i is
    position lo + i; lo is the first query's window start with a sliding window (0 without)."""
    lo = min(cache_len, max(0, int(positions[0]) - sliding_window + 1)) if sliding_window else 0
    key_pos = lo + torch.arange(cache_len - lo + n_win, device=positions.device)
    mask = key_pos[None, :] <= positions[:, None]
    if sliding_window:
        mask &= key_pos[None, :] > positions[:, None] - sliding_window
    if tree_mask is not None:
        mask = tree_visible(mask, key_pos, tree_mask, tree_lo)
    return lo, mask


def tree_visible(mask: torch.Tensor, key_index: torch.Tensor, tree_mask: torch.Tensor, lo: int) -> torch.Tensor:
    """`mask [q, n]` with the keys at index >= lo (a tree window's rows) replaced by the queries'
    ancestor bits `tree_mask [q, words]`; rows past the bitmask are invisible."""
    j = key_index - lo
    in_tree = j >= 0
    jc = j.clamp(min=0)
    word = jc // 64
    fits = word < tree_mask.shape[1]
    bits = (tree_mask[:, word.clamp(max=tree_mask.shape[1] - 1)] >> (jc % 64)) & 1
    return torch.where(in_tree[None, :], (bits != 0) & fits[None, :], mask)


def verify_attention(q, key_cache, value_cache, block_tables, cache_lens, query_start_loc, positions,
                     *, win_key=None, win_value=None, win_rows=None, win_start=None,
                     k_scale=None, v_scale=None, scale, out=None, backend=None,
                     sliding_window: int = 0, ring_slots: int = 0, log_key=None, log_value=None,
                     log_lo=None, log_start=None, tree_mask=None, tree_lo=None, max_query_len: int = 0,
                     trusted: bool = False) -> torch.Tensor:
    """Attention of every request's query rows to its cached keys (and window rows), `[T, Hq, D]`.

    See the module docstring for shapes and semantics. out: written in place when given.
    backend: "triton", "reference" or None (triton for CUDA tensors when triton imports).
    trusted: the caller (the engine) built the arguments and checked them once: skip the Python
    checks, which cost more host time than the launch.
    """
    extra = dict(sliding_window=sliding_window, ring_slots=ring_slots, log_key=log_key, log_value=log_value,
                 log_lo=log_lo, log_start=log_start, tree_mask=tree_mask, tree_lo=tree_lo)
    if not trusted:
        check_verify_args(q, key_cache, value_cache, block_tables, cache_lens, query_start_loc, positions,
                          win_key, win_value, win_rows, win_start, k_scale, v_scale, scale, out, **extra)
        _check_max_query_len(max_query_len, query_start_loc)
    which = resolve_backend(backend, q.device)
    if which == "reference":
        return verify_attention_reference(
            q, key_cache, value_cache, block_tables, cache_lens, query_start_loc, positions,
            win_key=win_key, win_value=win_value, win_rows=win_rows, win_start=win_start,
            k_scale=k_scale, v_scale=v_scale, scale=scale, out=out, trusted=True, **extra)
    T, hq, d = q.shape
    if not trusted and (d < 16 or d > 256 or d & (d - 1)):
        raise ValueError(f"q: head_size {d} is not a power of two in 16..256, which the Triton kernel needs "
                         f"(tl.arange, tl.dot); use backend='reference'")
    if out is None:
        out = torch.empty((T, hq, d), dtype=q.dtype, device=q.device)
    if T == 0:
        return out
    h = key_cache.shape[2]
    if is_fp8(key_cache.dtype):   # the kernel reads scale[kv_head]: a scalar becomes [H]
        k_scale = k_scale.reshape(-1).expand(h).contiguous() if k_scale.numel() != h else k_scale.reshape(-1)
        v_scale = v_scale.reshape(-1).expand(h).contiguous() if v_scale.numel() != h else v_scale.reshape(-1)
    return _load_kernels().launch(q, key_cache, value_cache, block_tables, cache_lens, query_start_loc,
                                  positions, win_key, win_value, win_rows, win_start, k_scale, v_scale,
                                  scale, out, max_query_len=max_query_len, **extra)


def _check_max_query_len(max_query_len, query_start_loc) -> None:
    """An int >= 0 and, when given and not capturing, no request has more rows (one host read)."""
    if isinstance(max_query_len, bool) or not isinstance(max_query_len, int) or max_query_len < 0:
        raise ValueError(f"max_query_len={max_query_len!r}: expected an int >= 0 (0: unknown)")
    if max_query_len and not capturing():
        most = int(query_start_loc.long().diff().max()) if query_start_loc.numel() > 1 else 0
        if most > max_query_len:
            raise ValueError(f"max_query_len={max_query_len}: a request has {most} query rows; pass a bound "
                             f"on every request's rows (or 0)")

