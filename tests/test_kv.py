"""Paged KV cache: layouts told apart by strides, block allocation, slot mapping."""
import pytest
import torch

from nwor_lab.kv import (BlockAllocator, BlockTable, KVCacheSpec, KVLayout, NoFreeBlocksError, PagedKVCache,
                         build_slot_mapping, detect_layout)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_layout_detected_from_strides_when_block_size_equals_heads(layout):
    cache = PagedKVCache(KVCacheSpec(2, 3, 8, 8, 16, layout=layout))
    assert cache.key.shape == (2, 3, 8, 8, 16)  # logical shape is the same for both
    assert detect_layout(cache.key) is KVLayout(layout)
    assert detect_layout(cache.layer(1)[0]) is KVLayout(layout)


def test_hnd_physical_order_is_heads_then_block_positions():
    cache = PagedKVCache(KVCacheSpec(1, 2, 4, 3, 8, layout="HND"))
    k = cache.layer(0)[0]
    k[1, 2, 0, 5] = 7.0  # block 1, offset 2, head 0, dim 5
    flat = k.permute(0, 2, 1, 3).contiguous().flatten()  # physical order [NB, H, BS, D]
    assert flat[((1 * 3 + 0) * 4 + 2) * 8 + 5] == 7.0


def test_detect_layout_rejects_other_strides():
    t = torch.zeros(2, 4, 3, 8)[..., ::2]
    with pytest.raises(ValueError, match="neither NHD nor HND"):
        detect_layout(t)


@pytest.mark.parametrize("cache_dtype,storage", [("auto", torch.bfloat16), ("fp8_e4m3", torch.float8_e4m3fn),
                                                 ("fp8_e5m2", torch.float8_e5m2)])
def test_storage_dtype_and_bytes(cache_dtype, storage):
    spec = KVCacheSpec(2, 4, 16, 8, 128, torch.bfloat16, cache_dtype)
    cache = PagedKVCache(spec)
    assert cache.key.dtype == storage
    assert spec.bytes_per_token_layer == 2 * 8 * 128 * (2 if cache_dtype == "auto" else 1)


def test_scales_scalar_and_per_head_and_errors():
    cache = PagedKVCache(KVCacheSpec(2, 4, 4, 3, 8, cache_dtype="fp8_e4m3"))
    cache.set_scales(0, 0.5)
    cache.set_scales(1, torch.tensor([0.1, 0.2, 0.3]), 0.25)
    assert cache.k_scale[0].tolist() == [0.5] * 3
    assert cache.k_scale[1].tolist() == pytest.approx([0.1, 0.2, 0.3])
    assert cache.v_scale[1].tolist() == [0.25] * 3
    with pytest.raises(ValueError, match="k_scale"):
        cache.set_scales(0, torch.ones(4))
    with pytest.raises(ValueError, match="> 0"):
        cache.set_scales(0, 0.0)
    with pytest.raises(IndexError, match="layer=2"):
        cache.layer(2)


def test_spec_errors_name_the_field():
    with pytest.raises(ValueError, match="block_size"):
        KVCacheSpec(1, 4, 0, 2, 8)
    with pytest.raises(ValueError, match="cache_dtype"):
        KVCacheSpec(1, 4, 4, 2, 8, cache_dtype="int8")


def test_block_table_lookahead_and_slots():
    alloc = BlockAllocator(8)
    a, b = BlockTable(alloc, 4), BlockTable(alloc, 4)
    a.ensure(5)                  # 2 blocks
    b.ensure(1, lookahead=4)     # 1 + 4 drafts -> 2 blocks
    assert a.blocks == [0, 1] and b.blocks == [2, 3]
    assert a.slots([0, 3, 4]) == [0, 3, 4]
    assert b.slots([0, 4]) == [8, 12]
    with pytest.raises(IndexError, match="no block"):
        a.slots([8])
    a.release()
    assert alloc.num_free == 6
    with pytest.raises(NoFreeBlocksError, match="num_blocks"):
        alloc.allocate(7)
    with pytest.raises(ValueError, match="double free"):
        alloc.free([0])


def test_build_slot_mapping_matches_block_tables():
    alloc = BlockAllocator(16)
    tables = [BlockTable(alloc, 4) for _ in range(3)]
    lens = [6, 1, 9]
    for t, n in zip(tables, lens):
        t.ensure(n)
    width = max(len(t.blocks) for t in tables)
    bt = torch.tensor([t.blocks + [-1] * (width - len(t.blocks)) for t in tables])
    token_req = torch.tensor([r for r, n in enumerate(lens) for _ in range(n)] + [0])
    positions = torch.tensor([p for n in lens for p in range(n)] + [-1])  # one padding token
    slots = build_slot_mapping(bt, token_req, positions, 4)
    want = [s for t, n in zip(tables, lens) for s in t.slots(range(n))] + [-1]
    assert slots.tolist() == want
