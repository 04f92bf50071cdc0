"""Reference ops against plain per-token loops, over the generated case matrix; bad inputs."""
import pytest
import torch

from nwor_lab.kv import KVLayout, detect_layout

from nwor_lab.kv.cache import FP8_MAX, PagedKVCache
from nwor_lab.ops import commit, log_slots, restore_slots, write_kv
from nwor_lab.ops.generators import make_case, per_layer_caches, standard_cases, vllm_flash_layer_caches
from nwor_lab.ops.quant import raw

CASES = list(standard_cases())


def loop_write(key, value, k_cache, v_cache, slots, ks, vs):
    """Token by token, head by head: the definition of reshape_and_cache_flash."""
    bs = k_cache.shape[1]
    for t, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        for h in range(key.shape[1]):
            for src, dst, sc in ((key, k_cache, ks), (value, v_cache, vs)):
                x = src[t, h]
                if dst.dtype in FP8_MAX:
                    m = FP8_MAX[dst.dtype]
                    x = (x.float() / sc.reshape(-1)[h if sc.numel() > 1 else 0]).clamp(-m, m)
                dst[s // bs, s % bs, h] = x.to(dst.dtype)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_write_kv_equals_loop(case):
    c = case.cache
    want_k, want_v = c.key.clone(), c.value.clone()
    for layer in range(c.num_layers):
        ks, vs = c.layer_scales(layer)
        args = (case.key[layer], case.value[layer])
        write_kv(*args, *c.layer(layer), case.slot_mapping, ks, vs)
        if case.key.shape[1] <= 64:  # the loop is slow; the big cases check log/restore/commit
            loop_write(*args, want_k[layer], want_v[layer], case.slot_mapping, ks, vs)
    if case.key.shape[1] <= 64:
        assert torch.equal(raw(c.key), raw(want_k)) and torch.equal(raw(c.value), raw(want_v))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_log_then_restore_is_bit_exact(case):
    c = case.cache
    before = c.snapshot()
    log_k, log_v = log_slots(c.key, c.value, case.slot_mapping)
    assert log_k.shape == (c.num_layers, case.slot_mapping.numel(), *c.key.shape[-2:])
    pad = case.slot_mapping < 0
    assert not raw(log_k)[:, pad].any(), "padding rows of the log must be zero"
    for layer in range(c.num_layers):
        write_kv(case.key[layer], case.value[layer], *c.layer(layer), case.slot_mapping, *c.layer_scales(layer))
    restore_slots(c.key, c.value, case.slot_mapping, log_k, log_v)
    assert torch.equal(raw(c.key), raw(before[0])) and torch.equal(raw(c.value), raw(before[1]))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_commit_equals_write_kv_of_kept_rows(case):
    c = case.cache
    want = _clone(c)
    kept = torch.where(case.commit_mask, case.slot_mapping, torch.full_like(case.slot_mapping, -1))
    for layer in range(c.num_layers):
        write_kv(case.key[layer], case.value[layer], *want.layer(layer), kept, *want.layer_scales(layer))
    staged_k = torch.cat([case.key, torch.zeros_like(case.key[:, :3])], 1)  # capacity > T
    staged_v = torch.cat([case.value, torch.zeros_like(case.value[:, :3])], 1)
    commit(staged_k, staged_v, c.key, c.value, case.slot_mapping, case.commit_mask,
           c.k_scale if c.is_fp8 else None, c.v_scale if c.is_fp8 else None)
    assert torch.equal(raw(c.key), raw(want.key)) and torch.equal(raw(c.value), raw(want.value))


def _stacked_bytes(layers):
    return torch.stack([raw(t) for t in layers])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_per_layer_caches_equal_stacked_for_every_op(case):
    """vLLM holds one tensor per layer: log, restore and commit on such lists give exactly the
    bytes of the stacked path (logs, and every layer's cache after each op)."""
    c = case.cache
    before = c.snapshot()
    keys, values = per_layer_caches(c)
    assert all(k.data_ptr() != c.key[i].data_ptr() for i, k in enumerate(keys))   # own allocations

    log_s = log_slots(c.key, c.value, case.slot_mapping)
    log_l = log_slots(keys, values, case.slot_mapping)
    for got, want in zip(log_l, log_s):
        assert got.dtype == want.dtype and torch.equal(raw(got), raw(want))

    ks, vs = (c.k_scale, c.v_scale) if c.is_fp8 else (None, None)
    staged_k = torch.cat([case.key, torch.ones_like(case.key[:, :2])], 1)     # capacity > T
    staged_v = torch.cat([case.value, torch.ones_like(case.value[:, :2])], 1)
    commit(staged_k, staged_v, c.key, c.value, case.slot_mapping, case.commit_mask, ks, vs)
    commit(staged_k, staged_v, keys, values, case.slot_mapping, case.commit_mask, ks, vs)
    assert torch.equal(_stacked_bytes(keys), raw(c.key)) and torch.equal(_stacked_bytes(values), raw(c.value))

    # Restore from the per-layer log into both forms: back to the bytes before the commit.
    restore_slots(c.key, c.value, case.slot_mapping, *log_s)
    restore_slots(keys, values, case.slot_mapping, *log_l)
    assert torch.equal(_stacked_bytes(keys), raw(c.key)) and torch.equal(_stacked_bytes(values), raw(c.value))
    assert torch.equal(raw(c.key), raw(before[0])) and torch.equal(raw(c.value), raw(before[1]))


def _clone(cache):
    twin = PagedKVCache(cache.spec, cache.device)
    for dst, src in ((twin.key, cache.key), (twin.value, cache.value), (twin.k_scale, cache.k_scale),
                     (twin.v_scale, cache.v_scale)):
        dst.copy_(src)
    return twin


def test_fp8_saturates_instead_of_overflowing():
    case = make_case(num_layers=1, num_tokens=4, cache_dtype="fp8_e4m3", scale_kind="scalar", pad_frac=0.0)
    c = case.cache
    key = torch.full_like(case.key[0], 1e6)
    write_kv(key, key, *c.layer(0), case.slot_mapping, *c.layer_scales(0))
    s = case.slot_mapping
    stored = c.key[0][s // c.spec.block_size, s % c.spec.block_size].float()
    assert torch.all(stored == 448.0)


# -- bad inputs name the argument -------------------------------------------------------------
@pytest.fixture
def small():
    return make_case(num_layers=1, num_tokens=6, num_kv_heads=2, head_size=8, block_size=4, num_blocks=4,
                     dtype=torch.float32, pad_frac=0.0)


def _w(case, **over):
    c = case.cache
    args = dict(key=case.key[0], value=case.value[0], key_cache=c.layer(0)[0], value_cache=c.layer(0)[1],
                slot_mapping=case.slot_mapping)
    args.update(over)
    return args


@pytest.mark.parametrize("over,match", [
    (lambda c: dict(key=c.key[0][None]), "key: expected shape"),
    (lambda c: dict(key=c.key[0].half()), "key: dtype"),
    (lambda c: dict(value=c.value[0][:, :1]), "value: expected shape"),
    (lambda c: dict(slot_mapping=c.slot_mapping.float()), "slot_mapping: dtype"),
    (lambda c: dict(slot_mapping=c.slot_mapping[:3]), "slot_mapping: expected shape"),
    (lambda c: dict(slot_mapping=torch.tensor([0, 1, 2, 3, 4, 16])), "slot_mapping: slot ids \\[16\\]"),
    (lambda c: dict(slot_mapping=torch.tensor([0, 1, 2, 3, 4, -2])), "outside the cache"),
    (lambda c: dict(slot_mapping=torch.tensor([0, 1, 2, 3, 4, 4])), "same slot appears twice"),
    (lambda c: dict(key_cache=c.cache.key), "key_cache: expected a 4-D"),
    (lambda c: dict(key_cache=torch.zeros(4, 4, 2, 8)[..., :8:1].transpose(0, 1)), "value_cache|NHD"),
])
def test_write_kv_bad_input(small, over, match):
    before = small.cache.snapshot()
    with pytest.raises((ValueError, TypeError), match=match):
        write_kv(**_w(small, **over(small)))
    assert torch.equal(small.cache.key, before[0]), "nothing may be written before the error"


def test_fp8_requires_scales():
    case = make_case(num_layers=1, num_tokens=2, cache_dtype="fp8_e5m2")
    with pytest.raises(ValueError, match="k_scale"):
        write_kv(case.key[0], case.value[0], *case.cache.layer(0), case.slot_mapping)


def test_restore_and_commit_bad_input(small):
    c = small.cache
    log_k, log_v = log_slots(c.key, c.value, small.slot_mapping)
    with pytest.raises(ValueError, match="log_k: expected shape"):
        restore_slots(c.key, c.value, small.slot_mapping[:2], log_k, log_v)
    with pytest.raises(ValueError, match="commit_mask: expected shape"):
        commit(small.key, small.value, c.key, c.value, small.slot_mapping, small.commit_mask[:2])
    with pytest.raises(TypeError, match="commit_mask: dtype"):
        commit(small.key, small.value, c.key, c.value, small.slot_mapping, small.commit_mask.int())
    with pytest.raises(ValueError, match="staged_key: holds"):
        commit(small.key[:, :2], small.value[:, :2], c.key, c.value, small.slot_mapping, small.commit_mask)


@pytest.mark.parametrize("case", [c for c in CASES if c.key.shape[1] <= 64][::3], ids=lambda c: c.name)
def test_vllm_flash_layout_caches_equal_stacked(case):
    """vLLM 0.33's per-layer FlashAttention cache ([NB, H, BS, 2D], K and V packed in the last
    dimension): its views are HND with padded rows (stride(BS) = 2D), and the ops, checked or
    trusted, give the stacked path's bytes."""
    c = case.cache
    keys, values = vllm_flash_layer_caches(c)
    assert detect_layout(keys[0]) is KVLayout.HND
    log_s = log_slots(c.key, c.value, case.slot_mapping)
    log_l = log_slots(keys, values, case.slot_mapping)
    assert all(torch.equal(raw(a), raw(b)) for a, b in zip(log_l, log_slots(keys, values, case.slot_mapping,
                                                                             trusted=True)))
    assert torch.equal(raw(log_l[0]), raw(log_s[0])) and torch.equal(raw(log_l[1]), raw(log_s[1]))
    ks, vs = (c.k_scale, c.v_scale) if c.is_fp8 else (None, None)
    commit(case.key, case.value, c.key, c.value, case.slot_mapping, case.commit_mask, ks, vs)
    commit(case.key, case.value, keys, values, case.slot_mapping, case.commit_mask, ks, vs)
    assert torch.equal(_stacked_bytes(keys), raw(c.key)) and torch.equal(_stacked_bytes(values), raw(c.value))
    restore_slots(keys, values, case.slot_mapping, *log_l)
    restore_slots(c.key, c.value, case.slot_mapping, *log_s)
    assert torch.equal(_stacked_bytes(keys), raw(c.key)) and torch.equal(_stacked_bytes(values), raw(c.value))


def test_per_layer_bad_input_names_the_argument(small):
    c = small.cache
    keys, values = per_layer_caches(c)
    with pytest.raises(ValueError, match="value_caches: has 0 layers"):
        log_slots(keys, [], small.slot_mapping)
    with pytest.raises(TypeError, match="value_cache: is a list"):
        log_slots(c.key, values, small.slot_mapping)
    with pytest.raises(TypeError, match="value_caches: expected a list"):
        log_slots(keys, c.value, small.slot_mapping)
    odd = [values[0].clone().transpose(1, 2).contiguous().transpose(1, 2)]         # HND layer among NHD
    with pytest.raises(ValueError, match=r"value_caches\[1\]: strides"):
        log_slots(keys + keys, values + odd, small.slot_mapping)
    # keys and values in two layouts (vLLM's CPU cache) are read by the reference; the CUDA ops refuse
    from nwor_lab.ops.slots import resolve_layer_ptrs
    log_slots(keys, odd, small.slot_mapping)
    with pytest.raises(ValueError, match="value_caches: strides .* differ from key_caches'"):
        resolve_layer_ptrs(keys, odd, None, True)
    with pytest.raises(ValueError, match=r"key_caches\[0\]: expected a 4-D"):
        log_slots([c.key], [c.value], small.slot_mapping)
    with pytest.raises(TypeError, match=r"value_caches\[0\]: dtype"):
        commit(small.key, small.value, keys, [v.double() for v in values], small.slot_mapping, small.commit_mask)
    with pytest.raises(ValueError, match="staged_key: expected shape"):
        commit(small.key, small.value, keys + keys, values + values, small.slot_mapping, small.commit_mask)
