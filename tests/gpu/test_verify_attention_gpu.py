"""verify_attention's Triton kernels on the GPU against the torch reference.

Random batches from `make_verify_attention_case`: fp32/fp16/bf16 queries, auto / fp8 e4m3 / fp8
e5m2 caches with per-head scales, NHD and HND layouts, with and without the window source, GQA
groups 1/4/8, head sizes 64/128/256, 1..16 queries per request, contexts up to 4096 (split and
unsplit key ranges); plus the stage window against the same window committed to the cache (bit
identical), the in-kernel fp8 round trip against torch's bytes, and a CUDA-graph replay.
Needs CUDA and triton, not the extension.

Compile-bound: every case with new compile-time constants (dtype, fp8 format, window, tile sizes)
compiles a kernel variant, about 5-7 s each on an H100 host's CPU, so a cold run of this file takes
a few minutes (Triton's cache makes later runs quick). Cheap, high-value checks come first.
"""
import itertools
import zlib

import pytest
import torch

from nwor_lab.ops.verify_attention import make_verify_attention_case, verify_attention, verify_attention_reference
from nwor_lab.ops.verify_attention_cases import case_to, window_written_to_cache

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TOL = {torch.float32: 1e-4, torch.float16: 3e-3, torch.bfloat16: 2e-2}


@pytest.fixture(scope="module")
def kernels():
    pytest.importorskip("triton", reason="the kernels need triton: pip install triton")
    from nwor_lab.ops import _verify_attention_triton
    return _verify_attention_triton


def check(case, **launch):
    ref = verify_attention_reference(**case.kwargs())
    if launch:
        from nwor_lab.ops import _verify_attention_triton as k
        a = case.kwargs()
        out = torch.empty(a["q"].shape, dtype=a["q"].dtype, device="cuda")
        scales = [s.reshape(-1) if s is not None else None for s in (a["k_scale"], a["v_scale"])]
        got = k.launch(*(a[n] for n in ("q", "key_cache", "value_cache", "block_tables", "cache_lens",
                                        "query_start_loc", "positions", "win_key", "win_value", "win_rows",
                                        "win_start")), *scales, a["scale"], out, **launch)
    else:
        got = verify_attention(**case.kwargs(), backend="triton")
    torch.cuda.synchronize()
    tol = TOL[case.q.dtype]
    assert torch.isfinite(got).all(), case.name
    torch.testing.assert_close(got.float(), ref.float(), atol=tol, rtol=tol, msg=lambda m: f"{case.name}: {m}")


@pytest.mark.parametrize("cache_dtype,dtype", [("fp8_e4m3", torch.bfloat16), ("fp8_e5m2", torch.float16),
                                               ("auto", torch.float32)])
def test_stage_window_equals_the_committed_window(kernels, cache_dtype, dtype):
    """Reading the window from the staging buffer gives the bits reading it back from the cache gives."""
    case = make_verify_attention_case(num_reqs=6, num_kv_heads=2, head_size=128, max_context=700, window=True,
                                      cache_dtype=cache_dtype, dtype=dtype, seed=31, device="cuda")
    committed = window_written_to_cache(case)
    a = verify_attention(**case.kwargs(), backend="triton")
    b = verify_attention(**committed.kwargs(), backend="triton")
    assert torch.equal(a, b), f"max diff {(a.float() - b.float()).abs().max().item()}"


@pytest.mark.parametrize("storage,scale", [(torch.float8_e4m3fn, 0.037), (torch.float8_e5m2, 0.011)])
def test_fp8_round_trip_matches_torch(kernels, storage, scale):
    from nwor_lab.ops.quant import dequantize, quantize
    every = torch.arange(256, dtype=torch.uint8).view(storage).float()
    every = every[torch.isfinite(every)].unique()
    x = torch.cat([every, (every[1:] + every[:-1]) / 2]) * scale
    x = torch.cat([x, torch.randn(8192) * 3, torch.randn(8192) * 1e-3, torch.zeros(1)])
    x = torch.cat([x, torch.zeros((1 << (x.numel() - 1).bit_length()) - x.numel())]).cuda()
    got = kernels.fp8_round_trip_check(x, storage, scale)
    s = torch.tensor([scale], device="cuda")
    want = dequantize(quantize(x[:, None, None], storage, s), torch.float32, s).flatten()
    assert int((got != want).sum()) == 0


def test_default_backend_on_cuda_is_triton_and_graph_capturable(kernels):
    from nwor_lab.ops.graphs import capture_graph
    case = make_verify_attention_case(num_reqs=3, window=True, cache_dtype="fp8_e4m3", max_context=600, seed=5,
                                      device="cuda")
    out = torch.empty(case.q.shape, dtype=case.q.dtype, device="cuda")
    graph = capture_graph(lambda: verify_attention(**case.kwargs(), out=out, trusted=True))
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), verify_attention_reference(**case.kwargs()).float(), atol=2e-2, rtol=2e-2)


def test_cpu_case_moved_to_cuda_keeps_strides(kernels):
    cpu = make_verify_attention_case(layout="HND", fused_q=True, window=True, seed=9)
    gpu = case_to(cpu, "cuda")
    assert gpu.key_cache.stride() == cpu.key_cache.stride() and gpu.q.stride() == cpu.q.stride()
    check(gpu)


@pytest.mark.parametrize("splits,block_n", [(1, 32), (5, 32), (2, 128), (16, 64)])
def test_forced_split_plans(kernels, splits, block_n):
    case = make_verify_attention_case(num_reqs=3, num_kv_heads=2, head_size=128, max_context=2500, window=True,
                                      cache_dtype="fp8_e5m2", dtype=torch.float16, seed=splits * 7 + block_n,
                                      device="cuda")
    check(case, num_splits=splits, block_n=block_n)


# Every case compiles its own kernel variant (dtype, fp8 format, window, tile sizes are compile-time
# constants; layouts only change strides), so the matrix alternates layouts over the dtype x cache
# pairs (each layout meets both sources) rather than multiplying by them.
MATRIX = [(d, c, ("NHD", "HND")[(i // 2) % 2], w) for i, (d, c, w) in enumerate(itertools.product(
    (torch.float32, torch.float16, torch.bfloat16), ("auto", "fp8_e4m3", "fp8_e5m2"), (False, True)))]


@pytest.mark.parametrize("dtype,cache_dtype,layout,window", MATRIX,
                         ids=[f"{str(d).split('.')[-1]}-{c}-{l}-{'win' if w else 'cache'}" for d, c, l, w in MATRIX])
def test_matrix(kernels, dtype, cache_dtype, layout, window):
    seed = MATRIX.index((dtype, cache_dtype, layout, window))
    case = make_verify_attention_case(num_reqs=5, num_kv_heads=2, head_size=128, dtype=dtype,
                                      cache_dtype=cache_dtype, layout=layout, window=window, max_context=300,
                                      seed=seed, device="cuda")
    check(case)


SHAPES = [
    # (name, kwargs)
    ("llama-gqa4-ctx4096", dict(num_reqs=4, num_kv_heads=8, num_q_heads=32, head_size=128, max_context=4096)),
    ("gqa8-q16", dict(num_reqs=6, num_kv_heads=2, num_q_heads=16, query_lens=16, max_context=1500)),
    ("gqa16-two-row-tiles", dict(num_reqs=3, num_kv_heads=1, num_q_heads=16, query_lens=16, max_context=500)),
    ("q1-batch64", dict(num_reqs=64, num_kv_heads=8, num_q_heads=32, head_size=128, query_lens=1, max_context=1000)),
    ("bs32-hnd-fused-q", dict(num_reqs=7, block_size=32, layout="HND", fused_q=True, max_context=1200)),
    ("empty-and-window-only", dict(num_reqs=4, query_lens=[3, 0, 7, 1], context_lens=[0, 40, 900, 0])),
    ("gqa1-d256", dict(num_reqs=5, num_kv_heads=4, num_q_heads=4, head_size=256, max_context=900)),
]


@pytest.mark.parametrize("name,kw", SHAPES, ids=[s[0] for s in SHAPES])
def test_shapes(kernels, name, kw):
    # one source per shape (alternating), the fp8 cache with the window: stage's hardest read
    window = SHAPES.index((name, kw)) % 2 == 1
    cache_dtype = "fp8_e4m3" if window else "auto"
    case = make_verify_attention_case(**kw, cache_dtype=cache_dtype, window=window, dtype=torch.bfloat16,
                                      seed=zlib.crc32(f"{name}{cache_dtype}{window}".encode()) % 1000, device="cuda")
    check(case)
