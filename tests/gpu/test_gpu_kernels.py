"""Every CUDA kernel against its torch reference, bit for bit (raw-byte comparison).

Cache ops run on stacked caches and on per-layer lists (the `.layers` overloads, vLLM's layout:
one tensor per layer reached through a device table of base addresses); both must give the
reference's bytes.

Cases come from `nwor_lab.ops.generators.standard_cases` (layouts NHD/HND incl. block_size ==
num_kv_heads, fp32/fp16/bf16 sources, auto/fp8 e4m3/e5m2 caches with scalar and per-head scales,
-1 padding, head sizes that disable 16-byte vectorisation, windows > 512 tokens), plus layouts of
the source the generator does not make (misaligned, strided slices of a fused QKV tensor).
"""
import pytest
import torch

from nwor_lab.ops.commit import commit_reference
from nwor_lab.ops.generators import make_case, per_layer_caches, standard_cases, vllm_flash_layer_caches
from nwor_lab.ops.quant import raw
from nwor_lab.ops.scv import scv_mask_reference
from nwor_lab.ops.slots import layer_pointers, log_slots_reference, restore_slots_reference
from nwor_lab.ops.write_kv import write_kv_reference

from .conftest import SANITIZE

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

CASES = list(standard_cases(device="cpu", big=not SANITIZE)) if torch.cuda.is_available() else []
IDS = [c.name for c in CASES]


def assert_same_bytes(got, want, what=""):
    g, w = raw(got).cpu(), raw(want).cpu()
    if not torch.equal(g, w):
        bad = (g != w).nonzero()
        first = tuple(bad[0].tolist())
        raise AssertionError(f"{what}: {bad.shape[0]} elements differ, first at {first}: "
                             f"got {g[first].item():#x} want {w[first].item():#x}")


def cuda_case(case):
    from nwor_lab.ops.generators import to_device

    return to_device(case, "cuda")


def cpu(*xs):
    """References run on the CPU (the obviously right path; fp8 indexing is complete there)."""
    out = tuple(x.cpu() if isinstance(x, torch.Tensor) else x for x in xs)
    return out[0] if len(out) == 1 else out


def layer_scales(cache, layer, form):
    """The layer's scales in one of the forms the op must honour."""
    if not cache.is_fp8:
        return None, None
    ks, vs = cache.layer_scales(layer)
    if form == "per_head":
        return ks, vs
    if form == "expanded":  # stride-0 view of one value
        return ks[:1].expand(ks.shape[0]), vs[:1].expand(vs.shape[0])
    return ks[0], vs[0]  # 0-d


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_write_kv_matches_reference(ext, case):
    case = cuda_case(case)
    cache = case.cache
    forms = ("per_head", "expanded", "scalar") if cache.is_fp8 else ("per_head",)
    for layer in range(cache.num_layers):
        for form in forms:
            ks, vs = layer_scales(cache, layer, form)
            got_k, got_v = cache.key.clone(), cache.value.clone()
            want_k, want_v = cache.key.clone(), cache.value.clone()
            ext.write_kv(case.key[layer], case.value[layer], got_k[layer], got_v[layer], case.slot_mapping, ks, vs)
            want_k, want_v = cpu(want_k, want_v)
            write_kv_reference(*cpu(case.key[layer], case.value[layer]), want_k[layer], want_v[layer],
                               *cpu(case.slot_mapping, ks, vs))
            assert_same_bytes(got_k, want_k, f"key layer {layer} scales {form}")
            assert_same_bytes(got_v, want_v, f"value layer {layer} scales {form}")


@pytest.mark.parametrize("cache_dtype", ["auto", "fp8_e4m3"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_write_kv_chunked_and_strided_sources(ext, layout, cache_dtype):
    """Chunks of a window written separately equal one write; sources that are slices of a fused
    QKV output (token stride > H*D) or start misaligned (scalar path) give the same bytes."""
    case = cuda_case(make_case(num_layers=1, num_tokens=600, num_kv_heads=8, head_size=128, layout=layout,
                               cache_dtype=cache_dtype, dtype=torch.bfloat16, seed=11))
    cache = case.cache
    ks, vs = layer_scales(cache, 0, "per_head")
    key, value, slots = case.key[0], case.value[0], case.slot_mapping
    want_k, want_v = cpu(cache.key.clone(), cache.value.clone())
    write_kv_reference(*cpu(key, value), want_k[0], want_v[0], *cpu(slots, ks, vs))

    got_k, got_v = cache.key.clone(), cache.value.clone()
    for lo, hi in ((0, 1), (1, 77), (77, 600)):
        ext.write_kv(key[lo:hi], value[lo:hi], got_k[0], got_v[0], slots[lo:hi], ks, vs)
    assert_same_bytes(got_k, want_k, "chunked key")
    assert_same_bytes(got_v, want_v, "chunked value")

    t, h, d = key.shape
    qkv = torch.randn(t, (16 + 2 * h) * d, device="cuda").to(key.dtype)  # [T, (Hq + 2 Hkv) * D]
    qkv[:, 16 * d:(16 + h) * d] = key.flatten(1)
    qkv[:, (16 + h) * d:] = value.flatten(1)
    k_view = qkv[:, 16 * d:(16 + h) * d].unflatten(1, (h, d))
    v_view = qkv[:, (16 + h) * d:].unflatten(1, (h, d))
    got_k, got_v = cache.key.clone(), cache.value.clone()
    ext.write_kv(k_view, v_view, got_k[0], got_v[0], slots, ks, vs)
    assert_same_bytes(got_k, want_k, "qkv-slice key")
    assert_same_bytes(got_v, want_v, "qkv-slice value")

    buf_k = torch.empty(key.numel() + 1, dtype=key.dtype, device="cuda")
    buf_v = torch.empty(value.numel() + 1, dtype=key.dtype, device="cuda")
    k_mis, v_mis = buf_k[1:].view(key.shape), buf_v[1:].view(key.shape)  # 2-byte aligned only
    k_mis.copy_(key), v_mis.copy_(value)
    got_k, got_v = cache.key.clone(), cache.value.clone()
    ext.write_kv(k_mis, v_mis, got_k[0], got_v[0], slots.int(), ks, vs)
    assert_same_bytes(got_k, want_k, "misaligned key")
    assert_same_bytes(got_v, want_v, "misaligned value")


@pytest.mark.parametrize("src,dst", [(torch.float32, torch.bfloat16), (torch.float32, torch.float16),
                                     (torch.bfloat16, torch.float32), (torch.float16, torch.bfloat16)])
def test_write_kv_converts_like_torch(ext, src, dst):
    """A non-fp8 cache of another dtype stores `x.to(cache dtype)` (round to nearest even)."""
    case = cuda_case(make_case(num_layers=1, num_tokens=64, dtype=dst, seed=3))
    key = (case.key[0].float() * 3.3).to(src)
    value = (case.value[0].float() * 0.7).to(src)
    got_k, got_v = case.cache.key.clone(), case.cache.value.clone()
    want_k, want_v = cpu(case.cache.key.clone(), case.cache.value.clone())
    ext.write_kv(key, value, got_k[0], got_v[0], case.slot_mapping, None, None)
    write_kv_reference(*cpu(key, value), want_k[0], want_v[0], cpu(case.slot_mapping))
    assert_same_bytes(got_k, want_k, "key")
    assert_same_bytes(got_v, want_v, "value")


def test_write_kv_skips_out_of_range_slots(ext):
    case = cuda_case(make_case(num_layers=1, num_tokens=32, pad_frac=0.0, seed=5))
    n = case.cache.num_slots
    slots = case.slot_mapping.clone()
    slots[::4] = n + 7      # never written (host validation would reject these; the kernel skips)
    slots[1::4] = -5
    got_k, got_v = case.cache.key.clone(), case.cache.value.clone()
    want_k, want_v = cpu(case.cache.key.clone(), case.cache.value.clone())
    ext.write_kv(case.key[0], case.value[0], got_k[0], got_v[0], slots, None, None)
    write_kv_reference(*cpu(case.key[0], case.value[0]), want_k[0], want_v[0], cpu(slots))
    assert_same_bytes(got_k, want_k, "key")
    assert_same_bytes(got_v, want_v, "value")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_commit_matches_reference(ext, case):
    case = cuda_case(case)
    cache = case.cache
    num_layers, t = case.key.shape[:2]
    # Staging buffer with spare capacity: rows t.. hold junk that must never reach the cache.
    junk = torch.randn(num_layers, 5, *case.key.shape[2:], device="cuda").to(case.key.dtype)
    staged_k = torch.cat([case.key, junk], dim=1)
    staged_v = torch.cat([case.value, junk * 2], dim=1)
    scale_forms = [(cache.k_scale, cache.v_scale)]
    if cache.is_fp8:
        scale_forms.append((cache.k_scale[:, :1].expand_as(cache.k_scale),   # stride-0 heads
                            cache.v_scale[:, :1].expand_as(cache.v_scale)))
    for ks, vs in scale_forms:
        ks, vs = (ks, vs) if cache.is_fp8 else (None, None)
        got_k, got_v = cache.key.clone(), cache.value.clone()
        want_k, want_v = cpu(cache.key.clone(), cache.value.clone())
        ext.commit(staged_k, staged_v, got_k, got_v, case.slot_mapping, case.commit_mask, ks, vs)
        commit_reference(*cpu(staged_k, staged_v), want_k, want_v,
                         *cpu(case.slot_mapping, case.commit_mask, ks, vs))
        assert_same_bytes(got_k, want_k, "key")
        assert_same_bytes(got_v, want_v, "value")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_log_and_restore_match_reference(ext, case):
    case = cuda_case(case)
    cache = case.cache
    slots = case.slot_mapping
    num_layers, _, _, h, d = cache.key.shape
    log_k = torch.empty((num_layers, slots.numel(), h, d), dtype=cache.key.dtype, device="cuda")
    log_v = torch.empty_like(log_k)
    raw(log_k).fill_(0x5A), raw(log_v).fill_(0x3C)  # poison: every row must be written
    ext.log_slots(cache.key, cache.value, slots, log_k, log_v)
    want_k, want_v = log_slots_reference(*cpu(cache.key, cache.value, slots))
    assert_same_bytes(log_k, want_k, "log_k")
    assert_same_bytes(log_v, want_v, "log_v")

    # Scribble over the whole cache, then restore the logged slots.
    got_k, got_v = cache.key.clone(), cache.value.clone()
    for t in (got_k, got_v):
        r = raw(t)
        r.copy_(torch.randint(-100, 100, r.shape, device="cuda").to(r.dtype))
    ref_k, ref_v = cpu(got_k.clone(), got_v.clone())
    ext.restore_slots(got_k, got_v, slots, log_k, log_v)
    restore_slots_reference(ref_k, ref_v, cpu(slots), want_k, want_v)
    assert_same_bytes(got_k, ref_k, "restored key")
    assert_same_bytes(got_v, ref_v, "restored value")


def stacked_bytes(layers):
    return torch.stack([raw(t) for t in layers])


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_commit_layers_matches_reference(ext, case):
    """commit.layers on per-layer caches (separate allocations) == the stacked reference."""
    case = cuda_case(case)
    cache = case.cache
    num_layers = case.key.shape[0]
    junk = torch.randn(num_layers, 3, *case.key.shape[2:], device="cuda").to(case.key.dtype)
    staged_k = torch.cat([case.key, junk], dim=1)
    staged_v = torch.cat([case.value, junk * 2], dim=1)
    ks, vs = (cache.k_scale, cache.v_scale) if cache.is_fp8 else (None, None)
    keys, values = per_layer_caches(cache)
    table = layer_pointers(keys, values)
    ext.commit.layers(staged_k, staged_v, keys, values, table, case.slot_mapping, case.commit_mask, ks, vs)
    want_k, want_v = cpu(cache.key.clone(), cache.value.clone())
    commit_reference(*cpu(staged_k, staged_v), want_k, want_v, *cpu(case.slot_mapping, case.commit_mask, ks, vs))
    assert_same_bytes(stacked_bytes(keys), raw(want_k), "key layers")
    assert_same_bytes(stacked_bytes(values), raw(want_v), "value layers")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_log_and_restore_layers_match_reference(ext, case):
    case = cuda_case(case)
    cache = case.cache
    slots = case.slot_mapping
    num_layers, _, _, h, d = cache.key.shape
    keys, values = per_layer_caches(cache)
    table = layer_pointers(keys, values)
    log_k = torch.empty((num_layers, slots.numel(), h, d), dtype=cache.key.dtype, device="cuda")
    log_v = torch.empty_like(log_k)
    raw(log_k).fill_(0x5A), raw(log_v).fill_(0x3C)
    ext.log_slots.layers(keys, values, table, slots, log_k, log_v)
    want_k, want_v = log_slots_reference(*cpu(cache.key, cache.value, slots))
    assert_same_bytes(log_k, want_k, "log_k")
    assert_same_bytes(log_v, want_v, "log_v")

    for t in keys + values:
        r = raw(t)
        r.copy_(torch.randint(-100, 100, r.shape, device="cuda").to(r.dtype))
    ref_k, ref_v = cpu(stacked_bytes(keys).clone(), stacked_bytes(values).clone())
    ext.restore_slots.layers(keys, values, table, slots, log_k, log_v)
    restore_slots_reference(ref_k, ref_v, cpu(slots), raw(want_k), raw(want_v))
    assert_same_bytes(stacked_bytes(keys), ref_k, "restored key layers")
    assert_same_bytes(stacked_bytes(values), ref_v, "restored value layers")


@pytest.mark.parametrize("cache_dtype", ["auto", "fp8_e4m3"])
def test_per_layer_python_api_equals_stacked(cache_dtype):
    """Through nwor_lab.ops (table built per call, then cached and reused): per-layer == stacked."""
    from nwor_lab.ops import commit, log_slots, restore_slots

    case = cuda_case(make_case(num_layers=4, num_tokens=40, cache_dtype=cache_dtype, layout="HND", seed=31))
    c = case.cache
    keys, values = per_layer_caches(c)
    ks, vs = (c.k_scale, c.v_scale) if c.is_fp8 else (None, None)
    table = layer_pointers(keys, values)
    for ptrs in (None, table):
        log_s = log_slots(c.key, c.value, case.slot_mapping, backend="cuda")
        log_l = log_slots(keys, values, case.slot_mapping, layer_ptrs=ptrs, backend="cuda")
        assert_same_bytes(log_l[0], log_s[0], "log_k"), assert_same_bytes(log_l[1], log_s[1], "log_v")
        commit(case.key, case.value, c.key, c.value, case.slot_mapping, case.commit_mask, ks, vs, backend="cuda")
        commit(case.key, case.value, keys, values, case.slot_mapping, case.commit_mask, ks, vs, layer_ptrs=ptrs,
               backend="cuda")
        assert_same_bytes(stacked_bytes(keys), raw(c.key), "committed key")
        restore_slots(c.key, c.value, case.slot_mapping, *log_s, backend="cuda")
        restore_slots(keys, values, case.slot_mapping, *log_l, layer_ptrs=ptrs, backend="cuda")
        assert_same_bytes(stacked_bytes(values), raw(c.value), "restored value")
    stale = table.clone()
    stale[0, 0] += 16
    with pytest.raises(ValueError, match="layer_ptrs: does not hold"):
        log_slots(keys, values, case.slot_mapping, layer_ptrs=stale, backend="cuda")


@pytest.mark.parametrize("cache_dtype", ["auto", "fp8_e4m3"])
@pytest.mark.parametrize("head_size", [128, 72])
def test_layers_ops_on_vllm_flash_layout(ext, cache_dtype, head_size):
    """vLLM 0.33's FlashAttention per-layer cache [NB, H, BS, 2D] (K, V packed in the last dim):
    the .layers kernels take its strided views and give the reference's bytes."""
    case = cuda_case(make_case(num_layers=3, num_tokens=50, num_kv_heads=4, head_size=head_size,
                               cache_dtype=cache_dtype, seed=47))
    c = case.cache
    keys, values = vllm_flash_layer_caches(c)
    table = layer_pointers(keys, values)
    n = case.slot_mapping.numel()
    log_k = torch.empty((3, n, 4, head_size), dtype=c.key.dtype, device="cuda")
    log_v = torch.empty_like(log_k)
    ext.log_slots.layers(keys, values, table, case.slot_mapping, log_k, log_v)
    want_k, want_v = log_slots_reference(*cpu(c.key, c.value, case.slot_mapping))
    assert_same_bytes(log_k, want_k, "log_k"), assert_same_bytes(log_v, want_v, "log_v")
    ks, vs = (c.k_scale, c.v_scale) if c.is_fp8 else (None, None)
    ext.commit.layers(case.key, case.value, keys, values, table, case.slot_mapping, case.commit_mask, ks, vs)
    ref_k, ref_v = cpu(c.key.clone(), c.value.clone())
    commit_reference(*cpu(case.key, case.value), ref_k, ref_v, *cpu(case.slot_mapping, case.commit_mask, ks, vs))
    assert_same_bytes(stacked_bytes(keys), raw(ref_k), "committed key")
    assert_same_bytes(stacked_bytes(values), raw(ref_v), "committed value")
    ext.restore_slots.layers(keys, values, table, case.slot_mapping, log_k, log_v)
    assert_same_bytes(stacked_bytes(keys), raw(c.key), "restored key")
    assert_same_bytes(stacked_bytes(values), raw(c.value), "restored value")


def test_commit_layers_in_a_cuda_graph(ext):
    """The table is built before capture; replays write the per-layer caches like eager runs."""
    case = cuda_case(make_case(num_layers=3, num_tokens=24, seed=41, pad_frac=0.0))
    keys, values = per_layer_caches(case.cache)
    table = layer_pointers(keys, values)
    mask = case.commit_mask.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ext.commit.layers(case.key, case.value, keys, values, table, case.slot_mapping, mask, None, None)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ext.commit.layers(case.key, case.value, keys, values, table, case.slot_mapping, mask, None, None)
    for t in keys + values:
        t.zero_()
    mask.copy_(~case.commit_mask)
    graph.replay()
    want_k = torch.zeros_like(case.cache.key).cpu()
    want_v = torch.zeros_like(case.cache.value).cpu()
    commit_reference(*cpu(case.key, case.value), want_k, want_v, *cpu(case.slot_mapping, mask))
    assert_same_bytes(stacked_bytes(keys), raw(want_k), "graph-replayed key layers")
    assert_same_bytes(stacked_bytes(values), raw(want_v), "graph-replayed value layers")


def test_per_layer_op_rejects_mismatched_layers(ext):
    case = cuda_case(make_case(num_layers=2, num_tokens=8, seed=43))
    keys, values = per_layer_caches(case.cache)
    table = layer_pointers(keys, values)
    log = torch.empty((2, 8, *keys[0].shape[2:]), dtype=keys[0].dtype, device="cuda")
    with pytest.raises(RuntimeError, match="value_caches: has 1 layers"):
        ext.log_slots.layers(keys, values[:1], table, case.slot_mapping, log, log.clone())
    with pytest.raises(RuntimeError, match="layer_ptrs: expected a contiguous int64"):
        ext.log_slots.layers(keys, values, table[:, :1], case.slot_mapping, log, log.clone())
    odd = [keys[0], keys[1][1:]]                                                   # fewer blocks
    with pytest.raises(RuntimeError, match=r"key_caches\[1\]"):
        ext.log_slots.layers(odd, values, table, case.slot_mapping, log, log.clone())


# ---------------------------------------------------------------------------------------------
# SCV

def scv_case(num_reqs, max_k, num_cols, vocab=5, seed=0, dtype=torch.int32, structured=True,
             with_prefill=True, pad_frac=0.1):
    """Drafts (about `pad_frac` of them -1 padding), cu, sampled ids like the rejection sampler's,
    and a window token map.

    structured: sampled[r] copies an accepted prefix of the drafts (never past a padding draft),
    then one emitted token (any id: it may equal the rejected draft, as after a zero-probability
    draft), then -1 placeholders. Otherwise sampled ids are random.
    """
    g = torch.Generator().manual_seed(seed)
    n = torch.randint(0, max_k + 1, (num_reqs,), generator=g)
    cu = n.cumsum(0)
    total = int(cu[-1]) if num_reqs else 0
    drafts = torch.randint(0, vocab, (total,), generator=g)
    drafts[torch.rand(total, generator=g) < pad_frac] = -1
    sampled = torch.full((num_reqs, num_cols), -1, dtype=torch.long)
    start = 0
    for r in range(num_reqs):
        k = int(n[r])
        if structured:
            mine = drafts[start:start + k].tolist()
            real = next((j for j, d in enumerate(mine) if d < 0), k)
            a = int(torch.randint(0, real + 1, (1,), generator=g))
            m = min(a, num_cols)
            sampled[r, :m] = drafts[start:start + m]
            if m < num_cols:
                sampled[r, m] = int(torch.randint(0, vocab, (1,), generator=g))
        else:
            sampled[r] = torch.randint(-1, vocab, (num_cols,), generator=g)
        start += k
    token_req, token_pos = [], []
    for r in range(num_reqs):
        extra = int(torch.randint(0, 3, (1,), generator=g)) if with_prefill else 0
        token_req += [r] * (1 + int(n[r]) + extra)
        token_pos += [0] * (1 + extra) + list(range(1, int(n[r]) + 1))
    perm = torch.randperm(len(token_req), generator=g)
    token_req = torch.tensor(token_req, dtype=torch.long)[perm]
    token_pos = torch.tensor(token_pos, dtype=torch.long)[perm]
    return [x.to(dtype) for x in (drafts, cu, sampled, token_req, token_pos)]


def run_scv(ext, drafts, cu, sampled, token_req, token_pos):
    dm = torch.ones(drafts.shape[0], dtype=torch.bool, device="cuda")
    acc = torch.full((cu.shape[0],), -7, dtype=torch.int32, device="cuda")
    cm = torch.ones(token_req.shape[0], dtype=torch.bool, device="cuda")
    ext.scv_mask(drafts, cu, sampled, token_req, token_pos, dm, acc, cm)
    return dm, acc, cm


SCV_SHAPES = [(1, 1, 2), (4, 3, 4), (64, 8, 9), (64, 8, 5), (7, 4, 0), (300, 6, 7), (3000, 8, 9)]


@pytest.mark.parametrize("structured", [True, False])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("shape", SCV_SHAPES, ids=[f"R{r}-k{k}-C{c}" for r, k, c in SCV_SHAPES])
def test_scv_mask_matches_reference(ext, shape, dtype, structured):
    num_reqs, max_k, num_cols = shape
    for seed in range(2 if SANITIZE else 4):
        args = [x.cuda() for x in scv_case(num_reqs, max_k, num_cols, seed=seed, dtype=dtype, structured=structured)]
        want = scv_mask_reference(*cpu(*args))
        got = run_scv(ext, *args)
        for name, g, w in zip(("draft_mask", "accepted_len", "commit_mask"), got, want):
            assert torch.equal(g.cpu(), w.cpu()), f"{name} differs (seed {seed})"


def test_scv_mask_mixed_dtypes_and_no_token_map(ext):
    drafts, cu, sampled, token_req, token_pos = [x.cuda() for x in scv_case(50, 6, 7, seed=9)]
    want = scv_mask_reference(*cpu(drafts.long(), cu, sampled.long(), token_req, token_pos.long()))
    got = run_scv(ext, drafts.long(), cu, sampled.long(), token_req, token_pos.long())
    for g, w in zip(got, want):
        assert torch.equal(g.cpu(), w)
    # Empty token map: commit_mask untouched (it has no elements), the rest computed.
    empty = torch.empty(0, dtype=torch.int32, device="cuda")
    dm, acc, cm = run_scv(ext, drafts, cu, sampled, empty, empty)
    assert torch.equal(dm.cpu(), want[0]) and torch.equal(acc.cpu(), want[1]) and cm.numel() == 0


def test_scv_mask_zero_probability_and_padding_drafts(ext):
    """The cases where comparing ids and counting differ: the kernel counts (emitted - 1) and
    stops at a -1 draft, like the reference and vLLM's runner."""
    drafts = torch.tensor([2, 5, -1, 3, 7, 8], dtype=torch.int32, device="cuda")
    cu = torch.tensor([2, 4, 6], dtype=torch.int32, device="cuda")
    sampled = torch.tensor([[2, -1, -1],        # d1 = 2 rejected (q = 0) and recovered as 2
                            [-1, 3, 4],         # malformed: -1 echoed; the padding draft still stops it
                            [7, 8, 1]], dtype=torch.int32, device="cuda")
    token_req = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2], dtype=torch.int32, device="cuda")
    token_pos = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2], dtype=torch.int32, device="cuda")
    dm, acc, cm = run_scv(ext, drafts, cu, sampled, token_req, token_pos)
    assert acc.tolist() == [0, 0, 2]
    assert dm.tolist() == [False, False, False, False, True, True]
    assert cm.tolist() == [True, False, False, True, False, False, True, True, True]
    want = scv_mask_reference(*cpu(drafts, cu, sampled, token_req, token_pos))
    for g, w in zip((dm, acc, cm), want):
        assert torch.equal(g.cpu(), w)


def test_scv_mask_strided_sampled_ids(ext):
    drafts, cu, sampled, token_req, token_pos = [x.cuda() for x in scv_case(40, 5, 6, seed=2)]
    wide = torch.full((sampled.shape[0], 2 * sampled.shape[1]), -9, dtype=sampled.dtype, device="cuda")
    wide[:, ::2] = sampled
    want = scv_mask_reference(*cpu(drafts, cu, sampled, token_req, token_pos))
    got = run_scv(ext, drafts, cu, wide[:, ::2], token_req, token_pos)
    for g, w in zip(got, want):
        assert torch.equal(g.cpu(), w)


# ---------------------------------------------------------------------------------------------
# torch.library.opcheck: schema (mutation annotations), fake impls, autograd registration, AOT

def _opcheck(op, args, fp8=False):
    # test_schema compares tensors before/after with allclose, which has no fp8 CUDA kernel in
    # torch; for fp8 caches run the other checks (the auto-dtype case covers the schema).
    tests = ("test_faketensor", "test_autograd_registration", "test_aot_dispatch_dynamic") if fp8 else None
    if tests is None:
        torch.library.opcheck(op, args)
    else:
        torch.library.opcheck(op, args, test_utils=tests)


@pytest.mark.parametrize("cache_dtype", ["auto", "fp8_e4m3"])
def test_opcheck_cache_ops(ext, cache_dtype):
    case = cuda_case(make_case(num_layers=2, num_tokens=12, cache_dtype=cache_dtype, seed=21, pad_frac=0.2))
    c = case.cache
    ks, vs = (c.k_scale, c.v_scale) if c.is_fp8 else (None, None)
    lks, lvs = (c.k_scale[0], c.v_scale[0]) if c.is_fp8 else (None, None)
    k0, v0 = c.key[0].clone(), c.value[0].clone()
    fp8 = c.is_fp8
    _opcheck(ext.write_kv.default, (case.key[0], case.value[0], k0, v0, case.slot_mapping, lks, lvs), fp8)
    _opcheck(ext.commit.default, (case.key, case.value, c.key.clone(), c.value.clone(), case.slot_mapping,
                                  case.commit_mask, ks, vs), fp8)
    n = case.slot_mapping.numel()
    log_k = torch.empty((2, n, *c.key.shape[3:]), dtype=c.key.dtype, device="cuda")
    log_v = torch.empty_like(log_k)
    _opcheck(ext.log_slots.default, (c.key, c.value, case.slot_mapping, log_k, log_v), fp8)
    _opcheck(ext.restore_slots.default, (c.key.clone(), c.value.clone(), case.slot_mapping, log_k, log_v), fp8)
    # Per-layer overloads: the kernels write through the table, so an AOT/functionalized run on
    # cloned caches would miss them (documented in nwor_lab/ops/slots.py); check schema and fakes.
    keys, values = per_layer_caches(c)
    table = layer_pointers(keys, values)
    tests = ("test_faketensor",) if fp8 else ("test_schema", "test_faketensor")
    torch.library.opcheck(ext.commit.layers, (case.key, case.value, keys, values, table, case.slot_mapping,
                                              case.commit_mask, ks, vs), test_utils=tests)
    torch.library.opcheck(ext.log_slots.layers, (keys, values, table, case.slot_mapping, log_k, log_v),
                          test_utils=tests)
    torch.library.opcheck(ext.restore_slots.layers, (keys, values, table, case.slot_mapping, log_k, log_v),
                          test_utils=tests)


def test_opcheck_scv_and_noop(ext):
    drafts, cu, sampled, token_req, token_pos = [x.cuda() for x in scv_case(8, 4, 5, seed=4)]
    outs = (torch.empty(drafts.shape[0], dtype=torch.bool, device="cuda"),
            torch.empty(cu.shape[0], dtype=torch.int32, device="cuda"),
            torch.empty(token_req.shape[0], dtype=torch.bool, device="cuda"))
    _opcheck(ext.scv_mask.default, (drafts, cu, sampled, token_req, token_pos, *outs))
    _opcheck(ext.noop.default, (drafts,))


def test_op_errors_with_numbers_raise_not_crash(ext):
    """A refused call whose message holds numbers and shapes raises RuntimeError. (Formatting them
    through the extension's own iostream crashed the process where libstdc++ is linked statically
    into it, as on the H200 machines.)"""
    cache = torch.zeros(2, 4, 4, 2, 8, device="cuda")
    bad_log = torch.zeros(2, 5, 2, 8, device="cuda")
    with pytest.raises(RuntimeError, match=r"log_k: expected shape \[2, 3, 2, 8\].*got \[2, 5, 2, 8\]"):
        ext.log_slots(cache, cache.clone(), torch.arange(3, device="cuda"), bad_log, bad_log.clone())
