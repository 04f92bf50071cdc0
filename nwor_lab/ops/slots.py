"""log_slots / restore_slots: copy-on-write for the draft slots of every layer at once.

    key_cache, value_cache  [L, NB, BS, H, D]  stacked, logical NHD (any physical layout), or
                            a list of L tensors [NB, BS, H, D] (per-layer caches, as vLLM holds them)
    slots                   [n]                int32/int64, -1 = nothing to log/restore
    log_k, log_v            [L, n, H, D]       cache storage dtype, raw bytes

The log holds raw bytes (copied through a same-size integer view), so restore is bit-exact for
every storage dtype, fp8 and NaN payloads included. Rows of slot -1 are zero in the log.

Per-layer caches: every layer must be allocated alike (same shape, strides, dtype, device). On
CUDA one launch still covers all layers: the kernel reads each layer's base address from
`layer_ptrs`, a device table `[2, L]` int64 (row 0 keys, row 1 values) made by
`layer_pointers(key_caches, value_caches)`. Build it once per list and pass it in (required
inside a CUDA graph capture, where the table cannot be uploaded); without it the op rebuilds it
on every call (one small host-to-device copy). The `.layers` CUDA ops write through the table,
not through their list arguments: under torch.compile's functionalization (which may hand the op
clones of the caches) their writes would land in the originals, so compile around them, not
through them. vLLM's cache ops have the same property.
"""
from __future__ import annotations

from typing import Sequence

import torch

from nwor_lab._checks import INDEX_DTYPES, capturing, check_slots, check_tensor
from nwor_lab.kv.layout import detect_layout
from nwor_lab.ops.backend import use_cuda
from nwor_lab.ops.quant import raw
from nwor_lab.ops.write_kv import valid_slot_rows


def is_layer_list(cache) -> bool:
    """True for per-layer caches (a list or tuple of tensors), False for a stacked tensor."""
    return isinstance(cache, (list, tuple))


def cache_layers(cache) -> Sequence[torch.Tensor]:
    """The `[NB, BS, H, D]` cache of every layer: views of a stacked tensor, or the list itself."""
    return cache.unbind(0) if isinstance(cache, torch.Tensor) else cache


def first_layer(cache) -> torch.Tensor:
    """A tensor of the cache (for its device and dtype): the stacked tensor or layer 0."""
    return cache[0] if is_layer_list(cache) else cache


def layer_pointers(key_caches: Sequence[torch.Tensor], value_caches: Sequence[torch.Tensor]) -> torch.Tensor:
    """`[2, L]` int64 on the caches' device: the base address of every layer's key cache (row 0)
    and value cache (row 1). The per-layer CUDA kernels read it; build it once per list of
    layers (the addresses never change while the tensors live) and keep it with the list."""
    _check_layer_lists(key_caches, value_caches)
    ptrs = [[t.data_ptr() for t in key_caches], [t.data_ptr() for t in value_caches]]
    return torch.tensor(ptrs, dtype=torch.int64).to(key_caches[0].device)


def _check_stacked(key_cache, value_cache) -> tuple[int, ...]:
    check_tensor("key_cache", key_cache, ndim=5,
                 what="[num_layers, num_blocks, block_size, num_kv_heads, head_size] (stacked)")
    check_tensor("value_cache", value_cache, shape=tuple(key_cache.shape), dtypes=(key_cache.dtype,),
                 device=key_cache.device, what="(same shape and dtype as key_cache)")
    detect_layout(key_cache), detect_layout(value_cache)
    return tuple(key_cache.shape)


def _check_layer_lists(key_caches, value_caches) -> tuple[int, ...]:
    if not is_layer_list(value_caches):
        raise TypeError(f"value_caches: expected a list of per-layer tensors like key_caches, got "
                        f"{type(value_caches).__name__}")
    if len(key_caches) == 0 or len(value_caches) != len(key_caches):
        raise ValueError(f"value_caches: has {len(value_caches)} layers but key_caches has {len(key_caches)}; "
                         f"pass one [num_blocks, block_size, num_kv_heads, head_size] tensor per layer in each")
    first = check_tensor("key_caches[0]", key_caches[0], ndim=4,
                         what="[num_blocks, block_size, num_kv_heads, head_size] (one layer)")
    for name, caches in (("key_caches", key_caches), ("value_caches", value_caches)):
        detect_layout(caches[0])
        for l, t in enumerate(caches):
            check_tensor(f"{name}[{l}]", t, shape=tuple(first.shape), dtypes=(first.dtype,), device=first.device,
                         what="(every layer alike: the shape and dtype of key_caches[0])")
            # keys and values may differ (vLLM's CPU cache: keys HDN, values HND), each list not
            if t.stride() != caches[0].stride():
                raise ValueError(f"{name}[{l}]: strides {t.stride()} differ from {name}[0]'s {caches[0].stride()}; "
                                 f"allocate every layer in the same layout")
    return (len(key_caches), *first.shape)


def check_caches(key_cache, value_cache) -> tuple[int, ...]:
    """`(L, NB, BS, H, D)` of stacked caches or per-layer lists; raises naming the argument."""
    if is_layer_list(key_cache):
        return _check_layer_lists(key_cache, value_cache)
    if is_layer_list(value_cache):
        raise TypeError("value_cache: is a list but key_cache is a tensor; pass both stacked or both per layer")
    return _check_stacked(key_cache, value_cache)


def resolve_layer_ptrs(key_caches, value_caches, layer_ptrs, validate: bool) -> torch.Tensor:
    """The `[2, L]` table for per-layer caches on CUDA: the caller's (checked against the lists
    when validating, one host sync), or a fresh one (impossible while capturing a CUDA graph)."""
    if key_caches[0].stride() != value_caches[0].stride():
        raise ValueError(f"value_caches: strides {value_caches[0].stride()} differ from key_caches' "
                         f"{key_caches[0].stride()}; the per-layer CUDA kernels read keys and values alike")
    if layer_ptrs is None:
        if capturing():
            raise ValueError("layer_ptrs: per-layer caches inside a CUDA graph capture need the table built "
                             "before capture; pass layer_ptrs=layer_pointers(key_caches, value_caches)")
        return layer_pointers(key_caches, value_caches)
    check_tensor("layer_ptrs", layer_ptrs, shape=(2, len(key_caches)), dtypes=(torch.int64,),
                 device=key_caches[0].device, what="[2, num_layers] from layer_pointers(key_caches, value_caches)")
    if validate and not capturing():
        want = [[t.data_ptr() for t in key_caches], [t.data_ptr() for t in value_caches]]
        if layer_ptrs.tolist() != want:
            raise ValueError("layer_ptrs: does not hold these caches' addresses (stale table?); rebuild it "
                             "with layer_pointers(key_caches, value_caches)")
    return layer_ptrs


def _log_stacked(key_cache, value_cache, slots):
    """Vectorised over layers: gather raw rows of every layer, zero the rows of invalid slots."""
    nb, bs = key_cache.shape[1:3]
    s = slots.long()
    invalid = (s < 0) | (s >= nb * bs)
    s = torch.where(invalid, torch.zeros_like(s), s)
    log_k = raw(key_cache)[:, s // bs, s % bs].clone()
    log_v = raw(value_cache)[:, s // bs, s % bs].clone()
    log_k[:, invalid] = 0
    log_v[:, invalid] = 0
    return log_k.view(key_cache.dtype), log_v.view(value_cache.dtype)


def _restore_stacked(key_cache, value_cache, slots, log_k, log_v) -> None:
    nb, bs = key_cache.shape[1:3]
    rows = valid_slot_rows(slots, nb * bs)
    s = slots.long()[rows]
    raw(key_cache)[:, s // bs, s % bs] = raw(log_k)[:, rows]
    raw(value_cache)[:, s // bs, s % bs] = raw(log_v)[:, rows]


def log_slots_reference(key_cache, value_cache, slots):
    """Stacked: one gather over all layers. Per layer: the slot arithmetic once, then one gather per
    layer and cache, stacked; both forms give the same bytes (rows of invalid slots zero)."""
    if not is_layer_list(key_cache):
        return _log_stacked(key_cache, value_cache, slots)
    nb, bs = key_cache[0].shape[:2]
    s = slots.long()
    invalid = (s < 0) | (s >= nb * bs)
    s = torch.where(invalid, torch.zeros_like(s), s)
    block, offset = s // bs, s % bs
    logs = []
    for caches in (key_cache, value_cache):
        log = torch.stack([raw(c)[block, offset] for c in caches])    # [L, n, H, D] raw bytes
        log[:, invalid] = 0
        logs.append(log.view(caches[0].dtype))
    return logs[0], logs[1]


def restore_slots_reference(key_cache, value_cache, slots, log_k, log_v) -> None:
    if not is_layer_list(key_cache):
        return _restore_stacked(key_cache, value_cache, slots, log_k, log_v)
    nb, bs = key_cache[0].shape[:2]
    rows = valid_slot_rows(slots, nb * bs)
    s = slots.long()[rows]
    block, offset = s // bs, s % bs
    for caches, log in ((key_cache, log_k), (value_cache, log_v)):
        rows_log = raw(log)[:, rows]
        for l, c in enumerate(caches):
            raw(c)[block, offset] = rows_log[l]


def log_slots(key_cache, value_cache, slots, *, layer_ptrs: torch.Tensor | None = None,
              backend: str | None = None, validate: bool = True, trusted: bool = False):
    """Return `(log_k, log_v)` `[L, n, H, D]`: raw contents of `slots` in every layer.
    `key_cache`/`value_cache` stacked or per-layer lists (then `layer_ptrs` as in the module doc);
    `validate` / `trusted` as in `write_kv`."""
    if not trusted:
        num_layers, nb, bs, h, d = check_caches(key_cache, value_cache)
        ref = first_layer(key_cache)
        check_tensor("slots", slots, ndim=1, dtypes=INDEX_DTYPES, device=ref.device)
        check_slots("slots", slots, nb * bs, validate)
    ref = first_layer(key_cache)
    num_layers = len(key_cache) if is_layer_list(key_cache) else key_cache.shape[0]
    h, d = ref.shape[-2:]
    if use_cuda(ref, backend):
        log_k = torch.empty((num_layers, slots.numel(), h, d), dtype=ref.dtype, device=ref.device)
        log_v = torch.empty_like(log_k)
        if is_layer_list(key_cache):
            table = resolve_layer_ptrs(key_cache, value_cache, layer_ptrs, validate and not trusted)
            torch.ops.nwor_lab.log_slots.layers(list(key_cache), list(value_cache), table, slots, log_k, log_v)
        else:
            torch.ops.nwor_lab.log_slots(key_cache, value_cache, slots, log_k, log_v)
        return log_k, log_v
    return log_slots_reference(key_cache, value_cache, slots)


def restore_slots(key_cache, value_cache, slots, log_k, log_v, *, layer_ptrs: torch.Tensor | None = None,
                  backend: str | None = None, validate: bool = True, trusted: bool = False) -> None:
    """Copy `log_k`/`log_v` back into `slots` of every layer (slot -1 skipped).
    Caches stacked or per-layer lists; `validate` / `trusted` as in `write_kv`."""
    if not trusted:
        _check_restore_args(key_cache, value_cache, slots, log_k, log_v, validate)
    ref = first_layer(key_cache)
    if use_cuda(ref, backend):
        if is_layer_list(key_cache):
            table = resolve_layer_ptrs(key_cache, value_cache, layer_ptrs, validate and not trusted)
            torch.ops.nwor_lab.restore_slots.layers(list(key_cache), list(value_cache), table, slots,
                                                    log_k.contiguous(), log_v.contiguous())
        else:
            torch.ops.nwor_lab.restore_slots(key_cache, value_cache, slots, log_k.contiguous(), log_v.contiguous())
        return
    restore_slots_reference(key_cache, value_cache, slots, log_k, log_v)


def _check_restore_args(key_cache, value_cache, slots, log_k, log_v, validate) -> None:
    num_layers, nb, bs, h, d = check_caches(key_cache, value_cache)
    ref = first_layer(key_cache)
    check_tensor("slots", slots, ndim=1, dtypes=INDEX_DTYPES, device=ref.device)
    shape = (num_layers, slots.numel(), h, d)
    for name, log in (("log_k", log_k), ("log_v", log_v)):
        check_tensor(name, log, shape=shape, dtypes=(ref.dtype,), device=ref.device,
                     what="[num_layers, num_slots_logged, num_kv_heads, head_size] from log_slots")
    check_slots("slots", slots, nb * bs, validate, unique=True)
