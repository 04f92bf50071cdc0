"""A whole verify window captured once in a CUDA graph, replayed with new data.

Graph: write_kv per layer into cache A (policy `off`), scv_mask, commit of every layer into cache
B (policy `stage`). Each replay gets new K/V, a new slot mapping (with -1 padding) and a new
acceptance pattern, copied into the static buffers; caches and masks must equal the torch
references every replay. Also: GraphedScv replays, recaptures on new shapes, and its forced
capture failure makes ScvRunner('adaptive') fall back to eager.
"""
import pytest
import torch

from nwor_lab.kv.cache import KVCacheSpec, PagedKVCache
from nwor_lab.ops.commit import commit_reference
from nwor_lab.ops.quant import raw
from nwor_lab.ops.scv import scv_mask_reference
from nwor_lab.ops.write_kv import write_kv_reference

from .test_gpu_kernels import assert_same_bytes, cpu, scv_case

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

NUM_REQS, MAX_K = 4, 3


def new_window(num_tokens, num_slots, gen, spec):
    """Random K/V, unique slots (-1 padded), and an SCV case whose token count is <= num_tokens."""
    seed = int(torch.randint(0, 1 << 30, (1,), generator=gen))
    drafts, cu, sampled, token_req, token_pos = scv_case(NUM_REQS, MAX_K, MAX_K + 1, seed=seed,
                                                         with_prefill=False)
    # Fixed shapes for the graph: pad drafts/sampled to NUM_REQS * MAX_K, tokens to num_tokens.
    total = NUM_REQS * MAX_K
    n = torch.diff(cu, prepend=cu.new_zeros(1))
    n[-1] += total - int(cu[-1])            # the last request takes the spare drafts
    cu = n.cumsum(0).to(torch.int32)
    drafts = torch.cat([drafts, torch.randint(0, 5, (total - drafts.shape[0],), generator=gen)]).to(torch.int32)
    token_req = torch.cat([token_req, torch.zeros(num_tokens - token_req.shape[0], dtype=token_req.dtype)])
    token_pos = torch.cat([token_pos, torch.zeros(num_tokens - token_pos.shape[0], dtype=token_pos.dtype)])
    slots = torch.randperm(num_slots, generator=gen)[:num_tokens]
    slots[torch.rand(num_tokens, generator=gen) < 0.15] = -1
    shape = (spec.num_layers, num_tokens, spec.num_kv_heads, spec.head_size)
    key = torch.randn(shape, generator=gen).to(spec.dtype)
    value = torch.randn(shape, generator=gen).to(spec.dtype)
    return dict(key=key, value=value, slots=slots, drafts=drafts, cu=cu, sampled=sampled.to(torch.int32),
                token_req=token_req.to(torch.int32), token_pos=token_pos.to(torch.int32))


@pytest.mark.parametrize("layout,cache_dtype", [("NHD", "auto"), ("HND", "auto"), ("NHD", "fp8_e4m3"),
                                                ("HND", "fp8_e5m2")])
def test_window_graph_replays_match_reference(ext, layout, cache_dtype):
    spec = KVCacheSpec(num_layers=3, num_blocks=16, block_size=8, num_kv_heads=4, head_size=64,
                       dtype=torch.bfloat16, cache_dtype=cache_dtype, layout=layout)
    cache_a, cache_b = PagedKVCache(spec, device="cuda"), PagedKVCache(spec, device="cuda")
    for c in (cache_a, cache_b):
        raw(c.key).copy_(torch.randint(0, 60, raw(c.key).shape, device="cuda").to(raw(c.key).dtype))
        raw(c.value).copy_(torch.randint(0, 60, raw(c.value).shape, device="cuda").to(raw(c.value).dtype))
        if c.is_fp8:
            for layer in range(spec.num_layers):
                c.set_scales(layer, 0.05 + 0.1 * torch.rand(spec.num_kv_heads), 0.07)
    num_tokens = NUM_REQS * (1 + MAX_K) + 3
    gen = torch.Generator().manual_seed(0)
    static = {k: v.cuda() for k, v in new_window(num_tokens, spec.num_slots, gen, spec).items()}
    draft_mask = torch.zeros(NUM_REQS * MAX_K, dtype=torch.bool, device="cuda")
    accepted_len = torch.zeros(NUM_REQS, dtype=torch.int32, device="cuda")
    commit_mask = torch.zeros(num_tokens, dtype=torch.bool, device="cuda")

    def window():
        for layer in range(spec.num_layers):
            ks, vs = cache_a.layer_scales(layer) if cache_a.is_fp8 else (None, None)
            ext.write_kv(static["key"][layer], static["value"][layer], cache_a.key[layer], cache_a.value[layer],
                         static["slots"], ks, vs)
        ext.scv_mask(static["drafts"], static["cu"], static["sampled"], static["token_req"], static["token_pos"],
                     draft_mask, accepted_len, commit_mask)
        ks, vs = (cache_b.k_scale, cache_b.v_scale) if cache_b.is_fp8 else (None, None)
        ext.commit(static["key"], static["value"], cache_b.key, cache_b.value, static["slots"], commit_mask, ks, vs)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        window()  # warm-up (kernel loading) outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        window()

    for step in range(6):
        new = new_window(num_tokens, spec.num_slots, gen, spec)
        for k, v in new.items():
            static[k].copy_(v)
        # References on the CPU, from the state before this replay.
        want_a = cpu(cache_a.key, cache_a.value)
        want_b = cpu(cache_b.key, cache_b.value)
        host = {k: v.cpu() for k, v in static.items()}
        for layer in range(spec.num_layers):
            ks, vs = cpu(*cache_a.layer_scales(layer)) if cache_a.is_fp8 else (None, None)
            write_kv_reference(host["key"][layer], host["value"][layer], want_a[0][layer], want_a[1][layer],
                               host["slots"], ks, vs)
        want_dm, want_acc, want_cm = scv_mask_reference(host["drafts"], host["cu"], host["sampled"],
                                                        host["token_req"], host["token_pos"])
        ks, vs = cpu(cache_b.k_scale, cache_b.v_scale) if cache_b.is_fp8 else (None, None)
        commit_reference(host["key"], host["value"], want_b[0], want_b[1], host["slots"], want_cm, ks, vs)

        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(draft_mask.cpu(), want_dm), f"replay {step}: draft_mask"
        assert torch.equal(accepted_len.cpu(), want_acc), f"replay {step}: accepted_len"
        assert torch.equal(commit_mask.cpu(), want_cm), f"replay {step}: commit_mask"
        assert_same_bytes(cache_a.key, want_a[0], f"replay {step}: cache A key")
        assert_same_bytes(cache_a.value, want_a[1], f"replay {step}: cache A value")
        assert_same_bytes(cache_b.key, want_b[0], f"replay {step}: cache B key")
        assert_same_bytes(cache_b.value, want_b[1], f"replay {step}: cache B value")


# ---------------------------------------------------------------------------------------------
# GraphedScv and ScvRunner

def test_graphed_scv_replays_and_recaptures(ext):
    from nwor_lab.speculative.scv_graph import GraphedScv

    g = GraphedScv()
    for seed in range(4):
        args = [x.cuda() for x in scv_case(16, 5, 6, seed=seed)]
        got = g(*args)
        want = scv_mask_reference(*cpu(*args))
        assert torch.equal(got.draft_mask.cpu(), want[0]) and torch.equal(got.accepted_len.cpu(), want[1])
        assert torch.equal(got.commit_mask.cpu(), want[2])
    assert g.num_captures >= 1
    captures = g.num_captures
    # Same shapes again: replay only. New shape: one more capture.
    args = [x.cuda() for x in scv_case(16, 5, 6, seed=1)]
    g(*args)
    args2 = [x.cuda() for x in scv_case(9, 3, 4, seed=7)]
    out = g(*args2[:3])  # no token map
    want = scv_mask_reference(*cpu(*args2[:3]))
    assert out.commit_mask is None and torch.equal(out.accepted_len.cpu(), want[1])
    assert g.num_captures >= captures + 1

    # Writing into the static inputs and passing them back skips the copies.
    static = g.static_inputs(*args)
    new = [x.cuda() for x in scv_case(16, 5, 6, seed=1)]
    if all(s.shape == n.shape for s, n in zip(static, new)):
        for s, n in zip(static, new):
            s.copy_(n)
        out = g(*static)
        want = scv_mask_reference(*cpu(*new))
        assert torch.equal(out.accepted_len.cpu(), want[1]) and torch.equal(out.commit_mask.cpu(), want[2])


def test_graphed_scv_forced_failure_and_adaptive_fallback(ext, monkeypatch):
    from nwor_lab.speculative.scv import ScvRunner
    from nwor_lab.speculative.scv_graph import FORCE_FAIL_ENV, GraphedScv, ScvGraphCaptureError

    args = [x.cuda() for x in scv_case(8, 4, 5, seed=3)]
    with pytest.raises(ScvGraphCaptureError, match="forced"):
        GraphedScv(force_capture_failure=True)(*args)

    monkeypatch.setenv(FORCE_FAIL_ENV, "1")
    want = scv_mask_reference(*cpu(*args))
    runner = ScvRunner("adaptive")
    out = runner(*args[:3], token_req=args[3], token_draft_pos=args[4])
    assert "fallback" in runner.how
    assert torch.equal(out.accepted_len.cpu(), want[1]) and torch.equal(out.commit_mask.cpu(), want[2])
    with pytest.raises(ScvGraphCaptureError):
        ScvRunner("graph")(*args[:3], token_req=args[3], token_draft_pos=args[4])

    monkeypatch.delenv(FORCE_FAIL_ENV)
    runner = ScvRunner("graph")
    out = runner(*args[:3], token_req=args[3], token_draft_pos=args[4])
    assert "graph" in runner.how.lower()
    assert torch.equal(out.draft_mask.cpu(), want[0]) and torch.equal(out.commit_mask.cpu(), want[2])
