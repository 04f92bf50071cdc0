"""verify_attention on CPU: the torch reference against write_and_attend, the Triton kernels under
Triton's CPU interpreter against the reference, and the argument checks.

The interpreter cases run in ONE subprocess (tests/verify_attention_interp.py): TRITON_INTERPRET
must be set before triton is imported and then holds for the whole process, which must not
happen to a pytest process that may also run the GPU tests. Skipped, with the install hint, when
triton is missing.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nwor_lab.kv import KVCacheSpec, PagedKVCache
from nwor_lab.model.attention import AttentionMetadata, write_and_attend
from nwor_lab.ops.quant import quantize
from nwor_lab.ops.verify_attention import (make_verify_attention_case, resolve_backend, verify_attention,
                                           verify_attention_reference)

HERE = Path(__file__).resolve().parent
TOL = {"float32": 1e-4, "float16": 3e-3, "bfloat16": 2e-2}


# -- the reference agrees with write_and_attend ------------------------------------------------
class BufferWriter:
    """A writer that keeps the window in a buffer (what `stage` declares) and writes nothing."""

    window_in_buffer = True

    def __init__(self, win_k, win_v):
        self.win = (win_k, win_v)

    def write(self, layer, key, value, token_offset=0):
        pass

    def window_kv(self, layer):
        return self.win


def filled_cache(h, d, bs, dtype, cache_dtype, layout, gen, num_blocks=24):
    cache = PagedKVCache(KVCacheSpec(1, num_blocks, bs, h, d, dtype, cache_dtype, layout))
    if cache.is_fp8:
        cache.set_scales(0, 0.02 + 0.02 * torch.rand(h, generator=gen), 0.02 + 0.02 * torch.rand(h, generator=gen))
    for t, sc in ((cache.key, cache.k_scale[0]), (cache.value, cache.v_scale[0])):
        x = torch.randn(num_blocks * bs, h, d, generator=gen).to(dtype)
        t[0].copy_(quantize(x, cache.spec.storage_dtype, sc).view(num_blocks, bs, h, d))
    return cache


@pytest.mark.parametrize("dtype,cache_dtype,layout,hq,in_buffer", [
    (torch.float32, "auto", "NHD", 8, True),
    (torch.float32, "auto", "HND", 2, False),
    (torch.bfloat16, "fp8_e4m3", "NHD", 8, True),
    (torch.float16, "fp8_e5m2", "HND", 4, True),
    (torch.bfloat16, "fp8_e4m3", "HND", 8, False),
])
def test_reference_equals_write_and_attend(dtype, cache_dtype, layout, hq, in_buffer):
    """Same cache, same window: write_and_attend (the model's attention) and the reference agree,
    with the window in a buffer (stage) and written into the cache first (off / cow)."""
    gen = torch.Generator().manual_seed(7)
    h, d, bs = 2, 16, 4
    cache = filled_cache(h, d, bs, dtype, cache_dtype, layout, gen)
    qlens, ctx = [3, 1, 4], [5, 0, 9]
    tables = [[3, 7, 1, 0], [5, 2], [4, 9, 11, 6, 8]]
    T = sum(qlens)
    q = torch.randn(T, hq, d, generator=gen).to(dtype)
    k = torch.randn(T, h, d, generator=gen).to(dtype)
    v = torch.randn(T, h, d, generator=gen).to(dtype)
    positions = [c + i for c, n in zip(ctx, qlens) for i in range(n)]
    qsl = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    bt = torch.full((3, 5), -1, dtype=torch.int32)
    for r, row in enumerate(tables):
        bt[r, :len(row)] = torch.tensor(row, dtype=torch.int32)
    ks, vs = cache.layer_scales(0)
    if in_buffer:
        # window rows scattered in a larger buffer: request r's rows are rows[qsl[r]:qsl[r+1]]
        buf_k = torch.randn(T + 3, h, d, generator=gen).to(dtype)
        buf_v = torch.randn(T + 3, h, d, generator=gen).to(dtype)
        rows = torch.randperm(T + 3, generator=gen)[:T]
        buf_k[rows], buf_v[rows] = k, v
        window_rows = [rows[qsl[r]:qsl[r + 1]].tolist() for r in range(3)]
        md = AttentionMetadata.build(cache, BufferWriter(buf_k, buf_v), positions, qlens, tables, ctx,
                                     window_rows=window_rows)
        want = write_and_attend(0, q, k, v, md, scale=d ** -0.5)
        got = verify_attention_reference(q, *cache.layer(0), bt, torch.tensor(ctx, dtype=torch.int32), qsl,
                                         torch.tensor(positions), win_key=buf_k, win_value=buf_v,
                                         win_rows=rows, win_start=qsl.clone(), k_scale=ks, v_scale=vs,
                                         scale=d ** -0.5)
    else:
        md = AttentionMetadata.build(cache, None, positions, qlens, tables, ctx)
        want = write_and_attend(0, q, k, v, md, scale=d ** -0.5)    # writes the window, then reads
        lens = torch.tensor([c + n for c, n in zip(ctx, qlens)], dtype=torch.int32)
        got = verify_attention_reference(q, *cache.layer(0), bt, lens, qsl, torch.tensor(positions),
                                         k_scale=ks, v_scale=vs, scale=d ** -0.5)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_reference_is_plain_softmax_attention():
    """One request, one head, no mask games: softmax(q k^T * scale) v, written out by hand."""
    c = make_verify_attention_case(num_reqs=1, query_lens=[3], context_lens=[5], num_kv_heads=1, num_q_heads=1,
                                   head_size=16, block_size=4, dtype=torch.float32, seed=3)
    got = verify_attention_reference(**c.kwargs())
    n = int(c.cache_lens[0])
    p = torch.arange(n)
    blk = c.block_tables[0].long()[p // 4]
    keys, values = c.key_cache[blk, p % 4, 0], c.value_cache[blk, p % 4, 0]
    s = c.q[:, 0] @ keys.T * c.scale
    s = s.masked_fill(p[None, :] > c.positions[:, None], float("-inf"))
    torch.testing.assert_close(got[:, 0], torch.softmax(s, -1) @ values, atol=1e-5, rtol=1e-5)


def test_default_backend_on_cpu_is_the_reference():
    assert resolve_backend(None, torch.device("cpu")) == "reference"
    c = make_verify_attention_case(seed=1, window=True, cache_dtype="fp8_e4m3")
    torch.testing.assert_close(verify_attention(**c.kwargs()), verify_attention_reference(**c.kwargs()))


def test_out_is_written_in_place():
    c = make_verify_attention_case(seed=2, dtype=torch.float32)
    out = torch.full(c.q.shape, float("nan"))
    assert verify_attention(**c.kwargs(), out=out) is out
    torch.testing.assert_close(out, verify_attention_reference(**c.kwargs()))


# -- argument checks ---------------------------------------------------------------------------
def _bad(**change):
    c = make_verify_attention_case(seed=4, window=True, cache_dtype="fp8_e4m3")
    kw = c.kwargs()
    kw.update(change)
    return kw


@pytest.mark.parametrize("change,match", [
    (dict(q=torch.zeros(3, 8)), r"q: expected a 3-D tensor"),
    (dict(q=torch.zeros(3, 8, 64, dtype=torch.int32)), r"q: dtype int32 is not supported"),
    (dict(block_tables=torch.zeros(4, 3, dtype=torch.int64)), r"block_tables: dtype int64 .*block_tables.to\(torch.int32\)"),
    (dict(cache_lens=torch.zeros(3, dtype=torch.int32)), r"cache_lens: expected shape \[4\]"),
    (dict(query_start_loc=torch.zeros(4, dtype=torch.int32)), r"query_start_loc: expected shape \[5\]"),
    (dict(positions=torch.zeros(2, dtype=torch.int64)), r"positions: expected shape"),
    (dict(win_rows=None), r"win_rows: missing"),
    (dict(win_key=torch.zeros(4, 3, 64, dtype=torch.bfloat16)), r"win_key: expected shape \[\*, 2, 64\]"),
    (dict(win_key=torch.zeros(40, 2, 64)), r"win_key: dtype float32 .* bfloat16"),
    (dict(win_start=torch.zeros(5, dtype=torch.int64)), r"win_start: dtype int64"),
    (dict(k_scale=None), r"k_scale: an fp8 cache needs float32 scales"),
    (dict(v_scale=torch.ones(3)), r"v_scale: expected \[num_kv_heads=2\]"),
    (dict(scale=-1.0), r"scale=-1.0: the softmax scale must be a positive float"),
    (dict(scale=None), r"scale=None"),
    (dict(out=torch.zeros(2, 8, 64, dtype=torch.bfloat16)), r"out: expected shape"),
])
def test_bad_arguments_are_named(change, match):
    with pytest.raises((TypeError, ValueError), match=match):
        verify_attention(**_bad(**change))


def test_bad_cache_arguments_are_named():
    kw = _bad()
    with pytest.raises(ValueError, match="value_cache: expected shape"):
        verify_attention(**{**kw, "value_cache": kw["value_cache"][:, :8]})
    with pytest.raises(TypeError, match=r"key_cache: dtype torch.float16 is neither q's dtype"):
        verify_attention(**{**kw, "key_cache": torch.zeros(kw["key_cache"].shape, dtype=torch.float16)})
    with pytest.raises(ValueError, match="key_cache: head_size 32 differs from q's 64"):
        verify_attention(**{**kw, "key_cache": kw["key_cache"][..., :32]})
    kc = kw["key_cache"]
    strided = torch.zeros(*kc.shape[:3], 2 * kc.shape[3], dtype=kc.dtype)[..., ::2]   # head_size not contiguous
    with pytest.raises(ValueError, match="key_cache: strides .* are neither NHD nor HND"):
        verify_attention(**{**kw, "key_cache": strided, "value_cache": strided})
    q = kw["q"]
    with pytest.raises(ValueError, match="q: 6 query heads is not a multiple of the cache's 4"):
        c = make_verify_attention_case(num_kv_heads=4, num_q_heads=6)
        verify_attention(**c.kwargs())
    with pytest.raises(ValueError, match="q: head_size must be the contiguous"):
        verify_attention(**{**kw, "q": q.transpose(0, 2).contiguous().transpose(0, 2)})


@pytest.mark.parametrize("field,value,match", [
    ("query_start_loc", [0, 2, 1, 5, 99], r"query_start_loc: must rise from 0 to num_tokens"),
    ("cache_lens", [1, 2, -1, 0], r"cache_lens: values \[-1\] are outside"),
    ("cache_lens", [1, 2, 10_000, 0], r"cache_lens: values \[10000\] are outside 0\.\."),
    ("win_start", [0, 2, 1, 3, 4], r"win_start: must rise"),
    ("positions", None, r"positions: must be >= 0"),
])
def test_bad_index_values_are_named(field, value, match):
    kw = _bad()
    t = kw[field]
    kw[field] = -torch.ones_like(t) if value is None else torch.tensor(value, dtype=t.dtype)
    with pytest.raises(ValueError, match=match):
        verify_attention(**kw)


def test_block_ids_out_of_range_and_empty_requests_are_named():
    kw = _bad()
    kw["block_tables"] = kw["block_tables"].clone()
    kw["block_tables"][0, 0] = 10_000
    with pytest.raises(ValueError, match=r"block_tables: block ids \[10000\]"):
        verify_attention(**kw)
    c = make_verify_attention_case(num_reqs=2, query_lens=[2, 1], context_lens=[0, 4])
    kw = c.kwargs()
    kw["cache_lens"] = torch.tensor([0, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"cache_lens: request 0 has query tokens but no keys"):
        verify_attention(**kw)


def test_bad_backend_is_named():
    c = make_verify_attention_case(seed=1)
    with pytest.raises(ValueError, match=r"backend='cuda': choose one of 'triton', 'reference'"):
        verify_attention(**c.kwargs(), backend="cuda")


def test_triton_on_cpu_without_the_interpreter_is_refused():
    """In this process the interpreter is off: backend='triton' on CPU tensors must say how to fix it
    (or, without triton, how to install it)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("this pytest process runs under Triton's interpreter")
    c = make_verify_attention_case(seed=1)
    match = "TRITON_INTERPRET=1" if importlib.util.find_spec("triton") else "pip install triton"
    with pytest.raises((ValueError, RuntimeError), match=match):
        verify_attention(**c.kwargs(), backend="triton")


def test_package_import_does_not_import_triton():
    code = ("import sys, nwor_lab, nwor_lab.ops, nwor_lab.ops.verify_attention, nwor_lab.model; "
            "print('triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_tree_window_launch_knobs_parse_and_name_a_bad_one():
    """NWOR_LAB_TREE_WINDOW_LAUNCH (tuning runs: the tree-window kernel's launch) takes name=int pairs."""
    kernels = pytest.importorskip("nwor_lab.ops._verify_attention_triton")
    assert kernels._knobs_from_env("num_warps=8, block_m=64,") == {"num_warps": 8, "block_m": 64}
    assert kernels._knobs_from_env("") == {}
    with pytest.raises(ValueError, match="NWOR_LAB_TREE_WINDOW_LAUNCH: unknown knob 'warps'"):
        kernels._knobs_from_env("warps=8")
    with pytest.raises(ValueError, match="block_n=128 must be 16 .. 64"):
        kernels._knobs_from_env("block_n=128")


# -- the Triton kernels under the interpreter --------------------------------------------------
def spec(id_, tol_dtype="bfloat16", kind="vs_reference", launch=None, **case):
    case.setdefault("dtype", tol_dtype)
    return dict(id=id_, kind=kind, case=case, launch=launch or {}, tol=TOL[case["dtype"]])


INTERP_SPECS = [
    spec("nhd-bf16-cache-gqa4", seed=1),
    spec("hnd-bf16-window-gqa4", layout="HND", window=True, seed=2),
    spec("nhd-fp32-window-gqa1", dtype="float32", window=True, num_q_heads=2, seed=3),
    spec("hnd-fp32-cache-gqa4", dtype="float32", layout="HND", seed=4),
    spec("nhd-fp16-cache-gqa4", dtype="float16", seed=5),
    spec("nhd-bf16-fp8e4m3-cache", cache_dtype="fp8_e4m3", seed=6),
    spec("hnd-bf16-fp8e4m3-window", cache_dtype="fp8_e4m3", layout="HND", window=True, seed=7),
    spec("nhd-fp16-fp8e5m2-window", dtype="float16", cache_dtype="fp8_e5m2", window=True, seed=8),
    spec("hnd-fp32-fp8e4m3-window-gqa1", dtype="float32", cache_dtype="fp8_e4m3", layout="HND", window=True,
         num_q_heads=2, seed=9),
    spec("d128-hnd-bf16-window", head_size=128, layout="HND", window=True, num_reqs=3, seed=10),
    spec("fused-q-view-window", window=True, fused_q=True, seed=11),
    spec("q16-gqa8-128-rows", query_lens=16, num_kv_heads=1, num_q_heads=8, num_reqs=2, seed=12),
    spec("q16-gqa16-two-row-tiles", query_lens=16, num_kv_heads=1, num_q_heads=16, num_reqs=2, head_size=32, seed=13),
    spec("q1-decode-like", query_lens=1, num_reqs=6, seed=14),
    spec("window-only-request", window=True, context_lens=[0, 17, 0], num_reqs=3, seed=15),
    spec("empty-request", query_lens=[3, 0, 5], window=True, num_reqs=3, seed=16),
    spec("bs8-eq-heads8-hnd", num_kv_heads=8, num_q_heads=8, block_size=8, head_size=16, layout="HND", seed=17),
    spec("bs32-d32", block_size=32, head_size=32, max_context=150, seed=18),
    spec("long-context-auto-splits", max_context=700, num_reqs=2, max_query_len=4, window=True, cache_dtype="fp8_e4m3", seed=19),
    # the merge kernel runs one interpreted program per (token, head): few tokens keep these quick
    spec("forced-3-splits-window-fp8", launch=dict(num_splits=3), window=True, cache_dtype="fp8_e5m2",
         max_context=300, num_reqs=3, max_query_len=4, seed=20),
    spec("forced-2-splits-fp32", dtype="float32", launch=dict(num_splits=2), max_context=200, num_reqs=3,
         max_query_len=4, seed=21),
    spec("block-n-32", launch=dict(block_n=32, num_splits=1), window=True, seed=22),
    spec("stage-equals-commit-fp8", kind="window_vs_cache", window=True, cache_dtype="fp8_e4m3", seed=23),
    spec("stage-equals-commit-fp32-hnd", kind="window_vs_cache", dtype="float32", window=True, layout="HND",
         max_context=200, seed=24),
    # the window tail: caches ending on a tile boundary (window tiles only), inside a tile with the
    # window spilling into the next (a mixed tile, then a window-only tile), and a window-only
    # request; the caller's query bound (a 32-row tile, no row walk, as the engine's verify steps)
    spec("stage-equals-commit-aligned-q-bound", kind="window_vs_cache", window=True, query_lens=5,
         context_lens=[64, 128, 0, 192], window_extra=0, launch=dict(max_query_len=5, num_splits=1), seed=25),
    spec("stage-equals-commit-spill-q-bound", kind="window_vs_cache", window=True, query_lens=5,
         context_lens=[60, 126, 3, 61], window_extra=[3, 0, 1, 2], launch=dict(max_query_len=5), seed=26),
    spec("split-tail-identical-spill", kind="split_tail_identical", window=True, query_lens=5,
         context_lens=[60, 126, 3, 64], window_extra=[3, 2, 1, 0], launch=dict(max_query_len=5, num_splits=2),
         seed=27),
    spec("split-tail-identical-sliding", kind="split_tail_identical", window=True, query_lens=4, num_reqs=3,
         context_lens=[70, 130, 10], window_extra=[1, 0, 2], launch=dict(sliding_window=24), seed=28),
    spec("q-bound-vs-reference", window=True, query_lens=[5, 3, 5, 1], launch=dict(max_query_len=5), seed=29),
    spec("q-bound-long-rows-vs-reference", query_lens=[20, 3], num_reqs=2, num_kv_heads=1, num_q_heads=8,
         launch=dict(max_query_len=20), seed=37),
    # sliding windows: on the linear cache, on rings (slack k: every row written; cow's log on a
    # ring of W; stage's window buffer on a ring of W), fp8, HND, forced splits
    dict(spec("sliding-linear-bf16", num_reqs=3, max_query_len=5, max_context=90, seed=30), ring=dict(W=16, linear=True)),
    dict(spec("sliding-ring-slack-fp32", dtype="float32", num_reqs=3, query_lens=5, max_context=90, seed=31),
         ring=dict(W=16, slack=4)),
    dict(spec("sliding-ring-log-bf16-hnd", layout="HND", num_reqs=3, query_lens=[5, 1, 3], max_context=90, seed=32),
         ring=dict(W=16, log=True)),
    dict(spec("sliding-ring-log-fp8", cache_dtype="fp8_e4m3", num_reqs=2, query_lens=4, max_context=80, seed=33),
         ring=dict(W=12, log=True)),
    dict(spec("sliding-ring-window-fp8", cache_dtype="fp8_e5m2", window=True, num_reqs=3, max_query_len=4,
              max_context=80, seed=34), ring=dict(W=16)),
    dict(spec("sliding-ring-window-fp32-bs4", dtype="float32", window=True, block_size=4, num_reqs=2,
              max_query_len=4, max_context=70, seed=35), ring=dict(W=10)),
    dict(spec("sliding-ring-log-3-splits", launch=dict(num_splits=3), num_reqs=2, query_lens=4, max_context=300,
              seed=36), ring=dict(W=150, log=True)),
    # tree windows (nwor_lab.speculative.tree_window): ancestor bits, positions = depths; write-all (the tree in the cache)
    # and stage (the tree in the window source); 70 nodes = two ancestor words; forced splits; sliding
    dict(spec("tree-cache-bf16-gqa4", max_context=70, seed=40),
         tree=dict(parents=[[0, 0, 1, 1, 2, 4, 4], [0], [0, 1, 0, 3, 3, 3]])),
    dict(spec("tree-window-fp32-hnd", dtype="float32", layout="HND", window=True, max_context=70,
              seed=41), tree=dict(parents=[[0, 0, 0, 1, 2, 3, 6], [0, 1, 2]])),
    dict(spec("tree-window-70-nodes", window=True, head_size=16, num_kv_heads=1, num_q_heads=1,
              context_lens=[40], launch=dict(num_splits=2), seed=42),
         tree=dict(parents=[[max(0, i - 2) for i in range(70)]])),
    # the tree 3 keys past the window's first row: key tile 2 holds bits of both ancestor words
    dict(spec("tree-window-tile-spans-two-words", window=True, head_size=16, num_kv_heads=1, num_q_heads=1,
              context_lens=[40], seed=48), tree=dict(parents=[[max(0, i - 3) for i in range(70)]]), tree_lo_shift=3),
    dict(spec("tree-cache-in-full-tiles", context_lens=[50, 120], head_size=16, seed=44),    # 50 + 14 = 64 keys
         tree=dict(parents=[[0, 0, 1, 1, 2, 4, 4, 6, 6, 8, 9, 9, 3], [0, 0, 2, 2, 3, 5, 5, 5]])),
    dict(spec("tree-cache-sliding-linear-fp8", cache_dtype="fp8_e4m3", context_lens=[50, 90], seed=43),
         tree=dict(parents=[[0, 0, 1, 2], [0, 1, 1]]), ring=dict(W=20, linear=True)),
    # stage's tree (the window source) and write-all's (the same rows committed): the same bits
    dict(spec("tree-window-vs-cache-bf16", kind="window_vs_cache", window=True, context_lens=[70, 5], seed=45),
         tree=dict(parents=[[0, 0, 1, 1, 2, 4, 4], [0, 1, 0, 3]])),
    dict(spec("tree-window-vs-cache-fp8-splits", kind="window_vs_cache", window=True, cache_dtype="fp8_e5m2",
              context_lens=[130], launch=dict(num_splits=3), seed=46), tree=dict(parents=[[0, 0, 1, 2, 2]])),
    # the tree path on keys below the tree: a chain window (stage) under the position rule
    dict(spec("tree-past-keys-window-bf16", window=True, num_reqs=3, query_lens=[4, 1, 3], seed=47),
         tree_past_keys=True),
    dict(id="fp8-round-trip-e4m3", kind="fp8_round_trip", storage="float8_e4m3fn", scale=0.037),
    dict(id="fp8-round-trip-e5m2", kind="fp8_round_trip", storage="float8_e5m2", scale=0.011),
]


@pytest.fixture(scope="module")
def interp_results(tmp_path_factory):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed: the kernels run on CPU under Triton's interpreter; "
                    "install it with `pip install triton`")
    tmp = tmp_path_factory.mktemp("verify_attention")
    (tmp / "specs.json").write_text(json.dumps(INTERP_SPECS))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(HERE.parent)}
    proc = subprocess.run([sys.executable, str(HERE / "verify_attention_interp.py"), str(tmp / "specs.json"),
                           str(tmp / "results.json")], env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"interpreter worker failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads((tmp / "results.json").read_text())


@pytest.mark.parametrize("s", INTERP_SPECS, ids=[s["id"] for s in INTERP_SPECS])
def test_triton_interpreter(interp_results, s):
    res = interp_results[s["id"]]
    assert "error" not in res, res.get("trace", res.get("error"))
    if s["kind"] == "fp8_round_trip":
        assert res["mismatches"] == 0, res
    elif s["kind"] == "split_tail_identical":
        assert res["bit_identical"], res
    elif s["kind"] == "window_vs_cache":
        # stage (window from the buffer) and the same window committed to the cache: same numbers,
        # same tiles, same order of reduction -> the same bits
        assert res["bit_identical"], res
        assert res["err_vs_committed_reference"] <= 2 * s["tol"] * 8, res
    else:
        assert res["finite"], res
        assert res["worst_excess"] <= 0, res
