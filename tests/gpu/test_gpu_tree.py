"""Tree windows on the GPU: the Triton verify attention with a tree mask against the torch reference
(write-all and staged windows, bf16 / fp16 / fp8 caches, 16 / 32 / 64-node trees, batch 1 / 8), the
tree commit through the CUDA `commit` op (stage: source rows != destination slots) and the move
(log + restore ops) against the reference, tree acceptance on the device equal to the CPU, and one
CUDA-graph replay of tree attention + greedy acceptance + stage commit.

Run: PYTHONPATH=$PWD python -m pytest -q -m gpu tests/gpu/test_gpu_tree.py
"""
import random

import pytest
import torch

from nwor_lab import LabConfig
from nwor_lab.kv import KVCacheSpec, PagedKVCache
from nwor_lab.ops.verify_attention import verify_attention, verify_attention_reference
from nwor_lab.ops.verify_attention_cases import case_to, make_tree_attention_case
from nwor_lab.policies import make_policy
from nwor_lab.speculative.tree_accept import accept_tree_greedy
from nwor_lab.speculative.tree_window import TreeWindow
from nwor_lab.window import Acceptance

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TOL = {torch.float32: 1e-4, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def random_parents(rng, n):
    return [rng.randrange(0, i + 1) for i in range(n)]


@pytest.mark.parametrize("nodes", [16, 32, 64])
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("window", [False, True])
@pytest.mark.parametrize("dtype,cache_dtype", [(torch.bfloat16, "auto"), (torch.float16, "auto"),
                                               (torch.bfloat16, "fp8_e4m3")])
def test_tree_attention_matches_reference(nodes, batch, window, dtype, cache_dtype):
    pytest.importorskip("triton")
    rng = random.Random(nodes * 100 + batch)
    parents = [random_parents(rng, nodes) for _ in range(batch)]
    case = make_tree_attention_case(parents, window=window, dtype=dtype, cache_dtype=cache_dtype, head_size=128,
                                    num_kv_heads=8, num_q_heads=32, block_size=16, max_context=2000,
                                    seed=nodes + batch)
    case = case_to(case, "cuda")
    ref = verify_attention_reference(**case.kwargs())
    got = verify_attention(**case.kwargs(), backend="triton", max_query_len=nodes + 1)
    torch.cuda.synchronize()
    tol = TOL[dtype]
    torch.testing.assert_close(got.float(), ref.float(), atol=tol, rtol=tol)


def _tree_case(seed, R=8, N=32, bs=16):
    rng = random.Random(seed)
    parents = [random_parents(rng, N) for _ in range(R)]
    tokens = []
    for p in parents:
        used, toks = {}, []
        for q in p:
            t = rng.choice([x for x in range(100) if x not in used.setdefault(q, set())])
            used[q].add(t)
            toks.append(t)
        tokens.append(toks)
    ctx = [rng.randrange(0, 200) for _ in range(R)]
    tables = torch.arange(R * 20, dtype=torch.int32).view(R, 20)
    w = TreeWindow.build(parents, tables.cuda(), ctx, bs, torch.tensor(sum(tokens, [])).cuda())
    return w, ctx


@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
def test_tree_commit_cuda_equals_reference(ext, mode):
    w, ctx = _tree_case(1)
    logits = torch.randn(w.num_tokens, 100, device="cuda")
    rows = w.token_parent[w.draft_rows]
    logits[rows, w.draft_token_ids.long()] += 4 * torch.rand(len(rows), device="cuda")
    verdict = accept_tree_greedy(w, logits)
    cpu_w = TreeWindow.build(w.parents_host(), torch.arange(8 * 20, dtype=torch.int32).view(8, 20), ctx, 16,
                             w.draft_token_ids.cpu())
    cpu_v = accept_tree_greedy(cpu_w, logits.cpu())
    assert torch.equal(verdict.sampled.cpu(), cpu_v.sampled)
    acc = verdict.acceptance(w)
    spec = KVCacheSpec(4, 200, 16, 8, 128, dtype=torch.bfloat16)
    caches = {}
    for backend, dev in (("cuda", "cuda"), ("torch", "cuda")):
        cache = PagedKVCache(spec, device=dev)
        g = torch.Generator(device="cuda").manual_seed(3)
        cache.key.copy_(torch.randn(cache.key.shape, generator=g, device="cuda"))
        cache.value.copy_(torch.randn(cache.value.shape, generator=g, device="cuda"))
        policy = make_policy(LabConfig(nwor_mode=mode, backend=backend), cache)
        g2 = torch.Generator(device="cuda").manual_seed(4)
        policy.begin(w)
        for layer in range(4):
            policy.write(layer, torch.randn(w.num_tokens, 8, 128, generator=g2, device="cuda").bfloat16(),
                         torch.randn(w.num_tokens, 8, 128, generator=g2, device="cuda").bfloat16())
        policy.commit(acc)
        caches[backend] = cache
    assert torch.equal(caches["cuda"].key, caches["torch"].key)
    assert torch.equal(caches["cuda"].value, caches["torch"].value)


def test_tree_step_replays_from_a_cuda_graph(ext):
    """Tree attention (stage window) + greedy acceptance + stage commit captured once, replayed."""
    pytest.importorskip("triton")
    w, ctx = _tree_case(2, R=4, N=16)
    spec = KVCacheSpec(1, 200, 16, 2, 64, dtype=torch.bfloat16)
    cache = PagedKVCache(spec, device="cuda")
    policy = make_policy(LabConfig(nwor_mode="stage", validate=False), cache, records=False)   # no host reads
    policy.reserve(w.num_tokens)
    q = torch.randn(w.num_tokens, 8, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(w.num_tokens, 2, 64, device="cuda", dtype=torch.bfloat16)
    logits = torch.randn(w.num_tokens, 100, device="cuda")
    tables = torch.arange(4 * 20, dtype=torch.int32, device="cuda").view(4, 20)
    lens = torch.tensor(ctx, dtype=torch.int32, device="cuda")
    qsl = torch.arange(0, 17 * 5, 17, dtype=torch.int32, device="cuda")
    pos = lens.long().repeat_interleave(17) + w.token_depth.long()
    w.children                                            # host tables before capture

    def body():
        policy.begin(w)
        policy.write(0, k, k)
        wk, wv = policy.window_kv(0)
        out = verify_attention(q, cache.key[0], cache.value[0], tables, lens, qsl, pos, win_key=wk, win_value=wv,
                               win_rows=torch.arange(w.num_tokens, device="cuda"), win_start=qsl, scale=0.125,
                               tree_mask=w.ancestors, tree_lo=lens, max_query_len=17, trusted=True)
        v = accept_tree_greedy(w, logits)
        policy.commit(Acceptance(v.path_mask[w.draft_rows], v.accepted_len,
                                 w.commit_mask_for(v.path_mask[w.draft_rows], v.accepted_len)))
        return out, v.sampled

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        eager_out, eager_sampled = body()                 # warm-up (compiles)
    torch.cuda.current_stream().wait_stream(s)
    eager_key = cache.key.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g_out, g_sampled = body()
    cache.key.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(g_out, eager_out) and torch.equal(g_sampled, eager_sampled)
    committed = eager_key != 0
    assert torch.equal(cache.key[committed], eager_key[committed])
