"""Sliding-window ring caches on the GPU (Triton attention, CUDA extension):

- the verify-attention kernel with a sliding window, on rings (slack, cow's log, stage's window
  buffer; fp8, HND, split key ranges) against the torch reference on the same linear cache;
- the engine: every exact strategy gives the target-only tokens (same W), off on a bare ring
  does not, the Triton and torch attentions decode the same tokens;
- CUDA graphs: a ring's steps replay from their buckets and decode exactly what the same body
  decodes eagerly; cow on a ring stays eager (`graphed_off` says why).

Self-contained: `python3 -m pytest -q tests/gpu/test_gpu_ring.py` on a CUDA machine (about a
minute cold: each kernel variant compiles once).
"""
import pytest
import torch

from nwor_lab import LabConfig
from nwor_lab.engine import generate
from nwor_lab.ops.verify_attention import make_verify_attention_case, verify_attention, verify_attention_reference
from nwor_lab.ops.verify_attention_cases import as_ring, case_to, with_window

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TOL = {torch.float32: 1e-4, torch.float16: 3e-3, torch.bfloat16: 2e-2}
W = 16
PROMPTS = ["def parse_args(argv):", "import os\nclass Config:", "for i in range(", "    return self._"]
EXACT = [("off", "slack"), ("off", "full"), ("off", "guard"), ("cow", "ring"), ("stage", "ring")]


# -- the kernel ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,cache_dtype,layout,window,log,slack,max_context", [
    (torch.bfloat16, "auto", "NHD", False, False, 8, 600),      # slack: every row written, ring of W + 8
    (torch.bfloat16, "auto", "HND", False, True, 0, 600),       # cow on a ring of W: the log serves evictions
    (torch.bfloat16, "fp8_e4m3", "NHD", False, True, 0, 300),
    (torch.bfloat16, "auto", "NHD", True, False, 0, 600),       # stage on a ring of W: the window buffer
    (torch.float16, "fp8_e5m2", "HND", True, False, 0, 300),
    (torch.float32, "auto", "NHD", False, False, None, 4000),   # the window on a linear cache (full)
])
@pytest.mark.parametrize("sliding_window", [64, 512])
def test_kernel_on_rings_equals_the_reference_on_the_linear_cache(dtype, cache_dtype, layout, window, log, slack,
                                                                  max_context, sliding_window):
    pytest.importorskip("triton", reason="the kernel needs triton: pip install triton")
    case = make_verify_attention_case(num_reqs=5, max_query_len=8, max_context=max_context, window=window,
                                      cache_dtype=cache_dtype, dtype=dtype, layout=layout, head_size=128, seed=41)
    linear = with_window(case, sliding_window)
    moved = linear if slack is None else as_ring(case, sliding_window, sliding_window + slack, log=log, seed=41)
    got = verify_attention(**case_to(moved, "cuda").kwargs(), backend="triton")
    torch.cuda.synchronize()
    ref = verify_attention_reference(**linear.kwargs())
    tol = TOL[dtype]
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float().cpu(), ref.float(), atol=tol, rtol=tol)


def test_kernel_on_a_ring_replays_in_a_cuda_graph():
    pytest.importorskip("triton", reason="the kernel needs triton: pip install triton")
    case = case_to(as_ring(make_verify_attention_case(num_reqs=4, max_query_len=5, max_context=900, seed=42),
                           256, 256, log=True, seed=42), "cuda")
    kw = case.kwargs()
    out = torch.empty_like(kw["q"])
    verify_attention(**kw, out=out, backend="triton", trusted=True)     # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        verify_attention(**kw, out=out, backend="triton", trusted=True)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    ref = verify_attention_reference(**case_to(case, "cpu").kwargs())
    torch.testing.assert_close(out.float().cpu(), ref.float(), atol=2e-2, rtol=2e-2)


# -- the engine ---------------------------------------------------------------------------------
def run(mode="off", ring="auto", k=4, **config):
    cfg = LabConfig(nwor_mode=mode, kv_ring=ring, sliding_window=W, backend="cuda", **config)
    return generate(PROMPTS, max_new_tokens=48, k=k, config=cfg, device="cuda", max_num_seqs=2, block_size=8)


@pytest.fixture(scope="module")
def reference():
    return run(k=0).token_ids


@pytest.mark.parametrize("mode,ring", EXACT, ids=[f"{m}+{r}" for m, r in EXACT])
def test_gpu_exact_strategies_equal_target_only(reference, mode, ring):
    out = run(mode, ring, debug=True)         # debug: every cache read checked against the ring ledger
    assert out.token_ids == reference
    assert out.kv["strategy"] == f"{mode}+{ring}"


def test_gpu_off_on_a_ring_of_w_diverges(reference):
    assert run("off", "ring").token_ids != reference


@pytest.mark.parametrize("mode,ring", [("stage", "ring"), ("cow", "ring"), ("off", "slack")])
def test_gpu_triton_and_torch_attention_decode_the_same_tokens(mode, ring):
    outs = [run(mode, ring, attention=a).token_ids for a in ("triton", "torch")]
    assert outs[0] == outs[1]


@pytest.mark.parametrize("mode,ring", [("stage", "ring"), ("cow", "ring"), ("off", "slack"), ("off", "guard")])
def test_gpu_graphed_ring_steps_decode_the_eager_tokens(mode, ring):
    """With CUDA graphs a ring's steps replay from their buckets (the ring slots are an argument of
    the one slot builder, W and S of the kernel's static metadata) and decode exactly the eager
    tokens; cow on a ring, whose attention reads evicted rows from its log, stays eager and says so."""
    graphed = run(mode, ring, cuda_graph=True, scv_mode="graph")
    eager = run(mode, ring, cuda_graph=False, scv_mode="graph")
    assert graphed.token_ids == eager.token_ids
    if mode == "cow" and ring == "ring":
        assert "log" in graphed.kv["cuda_graph_off"] and graphed.engine.runner.replays == 0
    else:
        assert graphed.kv["cuda_graph_off"] is None and graphed.engine.runner.replays > 0
    assert eager.kv["cuda_graph_off"] is None
