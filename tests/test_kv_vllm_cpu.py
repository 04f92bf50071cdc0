"""vLLM 0.32's CPU cache layout in the lab: [NB, H, BS, 2D] per layer, keys transposed per block x
head (`HDN`), then values (`HND`, padded rows). The ops, the policies and the cache pictures run on
it through logical NHD views, bit-identical to the stacked NHD path."""
import pytest
import torch

from nwor_lab import LabConfig
from nwor_lab.kv import KVCacheSpec, KVLayout, PagedKVCache, detect_layout
from nwor_lab.kv.layout import allocate_pair, vllm_cpu_views
from nwor_lab.ops import commit, log_slots, restore_slots, write_kv
from nwor_lab.ops.generators import make_case, vllm_cpu_layer_caches
from nwor_lab.ops.quant import raw
from nwor_lab.policies import make_policy
from nwor_lab.policies.invariants import check_invariants, off_reference, random_window, run_window


def test_views_put_elements_where_vllms_cpu_kernel_does():
    # the byte map read off vllm-cpu 0.32's cpu_attn_reshape_and_cache ("vec" kernels), BS 32, D 64:
    # key element d of slot (block 1, offset 1), head 0 -> run (1, 0) element d * 32 + 1; value -> 2048 + 64 + d
    packed = torch.zeros(2, 2, 32, 128)
    k, v = vllm_cpu_views(packed)
    k[1, 1, 0] = torch.arange(64, dtype=torch.float32) + 1
    v[1, 1, 0] = -(torch.arange(64, dtype=torch.float32) + 1)
    run = packed[1, 0].flatten()
    assert torch.equal(run[torch.arange(64) * 32 + 1], torch.arange(64, dtype=torch.float32) + 1)
    assert torch.equal(run[2048 + 64 + torch.arange(64)], -(torch.arange(64, dtype=torch.float32) + 1))
    assert int((packed != 0).sum()) == 128


@pytest.mark.parametrize("bs,h", [(32, 2), (4, 4)])      # block_size == num_kv_heads too
def test_detected_from_strides(bs, h):
    k, v = vllm_cpu_views(torch.zeros(3, h, bs, 2 * 8))
    assert detect_layout(k) is KVLayout.HDN and detect_layout(v) is KVLayout.HND
    key, value = allocate_pair((2, 3, bs, h, 8), "VLLM_CPU", torch.float32, "cpu")
    assert detect_layout(key) is KVLayout.HDN and detect_layout(value) is KVLayout.HND
    assert key.untyped_storage().data_ptr() == value.untyped_storage().data_ptr()


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="packed: expected vLLM's CPU cache"):
        vllm_cpu_views(torch.zeros(3, 2, 32, 7))
    with pytest.raises(ValueError, match="allocate_pair for"):
        from nwor_lab.kv.layout import allocate
        allocate((2, 32, 2, 8), "VLLM_CPU", torch.float32, "cpu")
    k, v = vllm_cpu_views(torch.zeros(3, 2, 32, 16))
    with pytest.raises(ValueError, match="values: 1 layers but keys has 2"):
        PagedKVCache.from_layers([k, k], [v], dtype=torch.float32, layout="VLLM_CPU")
    with pytest.raises(ValueError, match=r"keys\[0\]: strides .* read as HND, but a VLLM_CPU cache keeps keys in HDN"):
        PagedKVCache.from_layers([v], [v], dtype=torch.float32, layout="VLLM_CPU")
    with pytest.raises(ValueError, match="KVCacheSpec.layout='HDN'"):
        KVCacheSpec(1, 2, 32, 2, 8, layout="HDN")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ops_on_vllm_cpu_layer_caches_equal_stacked(dtype):
    case = make_case(num_layers=3, num_tokens=24, num_kv_heads=2, head_size=16, block_size=32, num_blocks=3,
                     dtype=dtype, seed=3)
    c = case.cache
    packed, keys, values = vllm_cpu_layer_caches(c)
    log_s, log_l = log_slots(c.key, c.value, case.slot_mapping), log_slots(keys, values, case.slot_mapping)
    assert torch.equal(raw(log_l[0]), raw(log_s[0])) and torch.equal(raw(log_l[1]), raw(log_s[1]))
    write_kv(case.key[0], case.value[0], keys[0], values[0], case.slot_mapping)
    write_kv(case.key[0], case.value[0], c.key[0], c.value[0], case.slot_mapping)
    commit(case.key, case.value, c.key, c.value, case.slot_mapping, case.commit_mask)
    commit(case.key, case.value, keys, values, case.slot_mapping, case.commit_mask)
    restore_slots(keys, values, case.slot_mapping, *log_l)
    restore_slots(c.key, c.value, case.slot_mapping, *log_s)
    for layer in range(3):
        assert torch.equal(raw(keys[layer]), raw(c.key[layer])) and torch.equal(raw(values[layer]), raw(c.value[layer]))
    # nothing outside the views: the packed tensors hold exactly the K and V bytes
    assert sum(int(raw(p).ne(0).sum()) for p in packed) == \
        sum(int(raw(k).ne(0).sum()) + int(raw(v).ne(0).sum()) for k, v in zip(keys, values))


@pytest.mark.parametrize("mode", ["off", "cow", "stage"])
def test_policies_keep_their_invariants_on_the_vllm_cpu_layout(mode):
    spec = KVCacheSpec(num_layers=3, num_blocks=4, block_size=32, num_kv_heads=2, head_size=16, layout="VLLM_CPU")
    cache = PagedKVCache(spec)
    gen = torch.Generator().manual_seed(7)
    cache.key.copy_(torch.randn(cache.key.shape, generator=gen)), cache.value.copy_(torch.randn(cache.key.shape, generator=gen))
    policy = make_policy(LabConfig(nwor_mode=mode), cache)
    for _ in range(4):
        rw = random_window(cache, gen)
        before = cache.snapshot()
        off_after = off_reference(cache, before, rw)
        run_window(policy, rw)
        assert check_invariants(policy, cache, before, off_after, rw) == []


def test_from_layers_cache_runs_a_policy_window_in_place():
    packed = [torch.zeros(4, 2, 32, 32) for _ in range(2)]
    views = [vllm_cpu_views(p) for p in packed]
    cache = PagedKVCache.from_layers([k for k, _ in views], [v for _, v in views], dtype=torch.float32,
                                     layout="VLLM_CPU")
    assert cache.spec.num_layers == 2 and cache.spec.block_size == 32 and cache.num_slots == 128
    policy = make_policy(LabConfig(nwor_mode="cow"), cache)
    rw = random_window(cache, torch.Generator().manual_seed(1))
    run_window(policy, rw)
    assert any(int(p.ne(0).sum()) for p in packed), "the policy wrote through the views into the packed tensors"
    snap = cache.snapshot()
    assert snap[0].shape == (2, 4, 32, 2, 16)
