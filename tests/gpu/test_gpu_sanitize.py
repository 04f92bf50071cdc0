"""The sanitizer selection: every Triton kernel of the lab once per compile-time variant that
changes what it reads or writes, at small shapes, checked against its torch reference, so that
`compute-sanitizer --tool memcheck` (every access) and `--tool racecheck` (shared memory) finish in
a few minutes (tests/gpu/sanitize.sh runs them and counts what they report).

    verify attention   cache / window source (split tail, single tail), fp8 cache with the window,
                       fp32 (IEEE dot), forced splits (the merge kernel), the row walk, a sliding
                       window on a ring with cow's log, HND layout, empty and window-only requests;
                       tree windows (the tree kernel and its merge): in the cache (write-all), in the
                       window (stage), fp8 with the window
    fused              RMSNorm, RoPE (into `out`, as zero-copy staging writes), silu * up
Compile-bound like the other kernel tests (a few seconds per variant on the host); the kernels
themselves take microseconds, which is what keeps the sanitizers quick.
"""
import pytest
import torch

from nwor_lab.ops import fused
from nwor_lab.ops.verify_attention import make_verify_attention_case, verify_attention_reference
from nwor_lab.ops.verify_attention_cases import (RING_FIELDS, TREE_FIELDS, as_ring, make_tree_attention_case,
                                                 window_written_to_cache, with_window)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TOL = {torch.float32: 1e-4, torch.float16: 3e-3, torch.bfloat16: 2e-2}
SMALL = dict(num_reqs=3, num_kv_heads=2, head_size=64, max_context=150, max_query_len=6)

ATTENTION = [
    # (id, case kwargs, launch knobs)
    ("cache-bf16", dict(), dict()),
    ("window-bf16-split-tail-q-bound", dict(window=True, query_lens=5), dict(max_query_len=5)),
    ("window-bf16-single-tail", dict(window=True), dict(split_tail=False)),
    ("window-fp8e4m3", dict(window=True, cache_dtype="fp8_e4m3"), dict()),
    ("cache-fp32-hnd", dict(dtype=torch.float32, layout="HND"), dict()),
    ("window-forced-3-splits-merge", dict(window=True, max_context=400), dict(num_splits=3)),
    ("row-walk-q16-gqa16", dict(num_kv_heads=1, num_q_heads=16, query_lens=16), dict()),
    ("empty-and-window-only", dict(window=True, query_lens=[3, 0, 5], context_lens=[0, 40, 0]), dict()),
]


def _launch(case, **launch):
    from nwor_lab.ops import _verify_attention_triton as k
    a = case.kwargs()
    out = torch.empty(a["q"].shape, dtype=a["q"].dtype, device="cuda")
    scales = [s.reshape(-1) if s is not None else None for s in (a["k_scale"], a["v_scale"])]
    ring = {name: a[name] for name in RING_FIELDS + TREE_FIELDS if name in a}
    k.launch(*(a[n] for n in ("q", "key_cache", "value_cache", "block_tables", "cache_lens", "query_start_loc",
                              "positions", "win_key", "win_value", "win_rows", "win_start")),
             *scales, a["scale"], out, **ring, **launch)
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("name,kw,launch", ATTENTION, ids=[a[0] for a in ATTENTION])
def test_sanitize_verify_attention(name, kw, launch):
    pytest.importorskip("triton")
    case = make_verify_attention_case(**{**SMALL, "dtype": torch.bfloat16, **kw}, seed=len(name), device="cuda")
    got = _launch(case, **launch)
    ref = verify_attention_reference(**case.kwargs())
    tol = TOL[case.q.dtype]
    torch.testing.assert_close(got.float(), ref.float(), atol=tol, rtol=tol)


TREE_PARENTS = [[0, 0, 1, 1, 2, 4, 4], [0, 1, 0, 3]]
TREES = [
    # (id, case kwargs, the tree committed to the cache (write-all) or left in the window (stage))
    ("tree-cache-bf16", dict(), True),
    ("tree-window-bf16", dict(), False),
    ("tree-window-fp8e5m2", dict(cache_dtype="fp8_e5m2"), False),
]


@pytest.mark.parametrize("name,kw,committed", TREES, ids=[t[0] for t in TREES])
def test_sanitize_tree_attention(name, kw, committed):
    pytest.importorskip("triton")
    case = make_tree_attention_case(TREE_PARENTS, window=True, context_lens=[70, 5], num_kv_heads=2, head_size=64,
                                    dtype=torch.bfloat16, seed=len(name), device="cuda", **kw)
    if committed:
        case = window_written_to_cache(case)
    got = _launch(case)
    ref = verify_attention_reference(**case.kwargs())
    torch.testing.assert_close(got.float(), ref.float(), atol=TOL[torch.bfloat16], rtol=TOL[torch.bfloat16])


def test_sanitize_verify_attention_ring_with_log():
    """A sliding window on a ring of W slots with cow's log rows (the log pointer select)."""
    pytest.importorskip("triton")
    case = make_verify_attention_case(**{**SMALL, "query_lens": 4, "max_context": 80}, dtype=torch.bfloat16, seed=5)
    linear = with_window(case, 16)
    ring = as_ring(case, 16, 16, log=True, seed=5)
    from nwor_lab.ops.verify_attention_cases import case_to
    got = _launch(case_to(ring, "cuda"))
    ref = verify_attention_reference(**linear.kwargs())
    torch.testing.assert_close(got.float().cpu(), ref.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_sanitize_fused_ops(dtype):
    x = torch.randn(7, 256, device="cuda").to(dtype)
    w = (1 + 0.1 * torch.randn(256, device="cuda")).to(dtype)
    torch.testing.assert_close(fused.rms_norm(x, w, 1e-5).float(), fused.rms_norm_reference(x, w, 1e-5).float(),
                               atol=2e-2, rtol=2e-2)
    q = torch.randn(7, 4, 64, device="cuda").to(dtype)
    cos, sin = torch.randn(7, 64, device="cuda").to(dtype), torch.randn(7, 64, device="cuda").to(dtype)
    out = torch.empty(16, 4, 64, device="cuda", dtype=dtype)[3:10]         # a strided slice, as staging rows
    fused.rope(q, cos, sin, out)
    torch.testing.assert_close(out.float(), fused.rope_reference(q, cos, sin).float(), atol=5e-2, rtol=2e-2)
    g, u = torch.randn(7, 300, device="cuda").to(dtype), torch.randn(7, 300, device="cuda").to(dtype)
    torch.testing.assert_close(fused.silu_mul(g, u).float(), fused.silu_mul_reference(g, u).float(),
                               atol=2e-2, rtol=2e-2)
