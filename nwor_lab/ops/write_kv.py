"""write_kv: scatter one layer's K/V rows into the paged cache (vLLM `reshape_and_cache_flash`).

    key, value      [T, H, D]      fp32 / fp16 / bf16, the window's new K/V
    key_cache, ...  [NB, BS, H, D] one layer, logical NHD view of an NHD or HND cache
    slot_mapping    [T]            int32/int64; slot -1 = padding, write nothing
    k_scale, ...    [H] or scalar  float32, required for fp8 caches

Example (block_size 4): slot 9 is block 2, offset 1, so `key_cache[2, 1] = quant(key[t])`.
"""
from __future__ import annotations

import torch

from nwor_lab._checks import FLOAT_DTYPES, INDEX_DTYPES, check_cache_source, check_slots, check_tensor
from nwor_lab.kv.layout import detect_layout
from nwor_lab.ops.backend import use_cuda
from nwor_lab.ops.quant import quantize


def valid_slot_rows(slot_mapping: torch.Tensor, num_slots: int) -> torch.Tensor:
    """Row indices whose slot is a real cache slot (padding and out-of-range are skipped)."""
    s = slot_mapping.long()
    return torch.nonzero((s >= 0) & (s < num_slots)).flatten()


def slot_destination(slot_mapping: torch.Tensor, num_slots: int, block_size: int):
    """`(rows, block, offset)`: the rows of `slot_mapping` [T] that name a real slot (None: every
    row does), and where each lives. The same for every layer of a window, so a caller writing
    many layers computes it once."""
    rows = valid_slot_rows(slot_mapping, num_slots)
    s = slot_mapping.long()[rows]
    return (None if rows.numel() == slot_mapping.numel() else rows), s // block_size, s % block_size


def write_rows(key, value, key_cache, value_cache, dest, k_scale=None, v_scale=None) -> None:
    """Quantise and index-put rows `dest[0]` of key/value `[T, H, D]` at `dest`'s (block, offset)."""
    rows, block, offset = dest
    if rows is not None:
        key, value = key[rows], value[rows]
    key_cache[block, offset] = quantize(key, key_cache.dtype, k_scale)
    value_cache[block, offset] = quantize(value, value_cache.dtype, v_scale)


def write_kv_reference(key, value, key_cache, value_cache, slot_mapping, k_scale=None, v_scale=None) -> None:
    """The obviously right version: gather valid rows, quantise, index-put."""
    nb, bs = key_cache.shape[:2]
    write_rows(key, value, key_cache, value_cache, slot_destination(slot_mapping, nb * bs, bs), k_scale, v_scale)


def check_write_args(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale,
                     validate: bool = True) -> None:
    """Raise, naming the argument, before anything is written."""
    check_tensor("key_cache", key_cache, ndim=4, what="[num_blocks, block_size, num_kv_heads, head_size]")
    nb, bs, h, d = key_cache.shape
    dev = key_cache.device
    check_tensor("value_cache", value_cache, shape=(nb, bs, h, d), dtypes=(key_cache.dtype,), device=dev,
                 what="(same shape and dtype as key_cache)")
    detect_layout(key_cache), detect_layout(value_cache)
    check_tensor("key", key, shape=(None, h, d), dtypes=FLOAT_DTYPES, device=dev,
                 what="[num_tokens, num_kv_heads, head_size] matching the cache")
    check_tensor("value", value, shape=tuple(key.shape), dtypes=FLOAT_DTYPES, device=dev,
                 what="(same shape as key)")
    if key.stride(-1) != 1 or value.stride(-1) != 1:
        raise ValueError("key/value: head_size must be the contiguous dimension; call .contiguous()")
    check_tensor("slot_mapping", slot_mapping, shape=(key.shape[0],), dtypes=INDEX_DTYPES, device=dev,
                 what="[num_tokens], one slot per key row")
    check_cache_source("key", key, key_cache, k_scale, v_scale, lambda sc: sc.numel() in (1, h),
                       f"(a scalar or [num_kv_heads={h}])", "PagedKVCache.layer_scales(layer)")
    if value.dtype != key.dtype:      # the check above looks at key only: never cast V silently
        raise TypeError(f"value: dtype {value.dtype} differs from key's {key.dtype}; K and V of a window share "
                        f"one dtype: cast with value.to({key.dtype})")
    check_slots("slot_mapping", slot_mapping, nb * bs, validate, unique=True)


def write_kv(key, value, key_cache, value_cache, slot_mapping, k_scale=None, v_scale=None, *,
             backend: str | None = None, validate: bool = True, trusted: bool = False) -> None:
    """Write `key`/`value` `[T,H,D]` into one layer's cache at `slot_mapping` (see module doc).

    validate: also check slot ranges on the host (a device sync on GPU).
    trusted:  the caller (a write policy) already checked every argument: skip the Python checks,
              which cost more host time than the launch itself (the CUDA op still checks shapes).
    """
    if not trusted:
        check_write_args(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale, validate)
    if use_cuda(key_cache, backend):
        h = key_cache.shape[2]
        ks = k_scale.reshape(-1).expand(h) if k_scale is not None else None
        vs = v_scale.reshape(-1).expand(h) if v_scale is not None else None
        torch.ops.nwor_lab.write_kv(key, value, key_cache, value_cache, slot_mapping, ks, vs)
        return
    write_kv_reference(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)
