"""log_slots / restore_slots: copy-on-write for the draft slots of every layer at once.

    key_cache, value_cache  [L, NB, BS, H, D]  stacked, logical NHD (any physical layout)
    slots                   [n]                int32/int64, -1 = nothing to log/restore
    log_k, log_v            [L, n, H, D]       cache storage dtype, raw bytes

The log holds raw bytes (copied through a same-size integer view), so restore is bit-exact for
every storage dtype, fp8 and NaN payloads included. Rows of slot -1 are zero in the log.
"""
from __future__ import annotations

import torch

from nwor_lab._checks import INDEX_DTYPES, check_slots, check_tensor
from nwor_lab.kv.layout import detect_layout
from nwor_lab.ops.backend import use_cuda
from nwor_lab.ops.quant import raw
from nwor_lab.ops.write_kv import valid_slot_rows


def _check_stacked(key_cache, value_cache) -> tuple[int, ...]:
    check_tensor("key_cache", key_cache, ndim=5,
                 what="[num_layers, num_blocks, block_size, num_kv_heads, head_size] (stacked)")
    check_tensor("value_cache", value_cache, shape=tuple(key_cache.shape), dtypes=(key_cache.dtype,),
                 device=key_cache.device, what="(same shape and dtype as key_cache)")
    detect_layout(key_cache), detect_layout(value_cache)
    return tuple(key_cache.shape)


def log_slots_reference(key_cache, value_cache, slots):
    num_layers, nb, bs, h, d = key_cache.shape
    s = slots.long().clamp(min=0)
    log_k = raw(key_cache)[:, s // bs, s % bs].clone()
    log_v = raw(value_cache)[:, s // bs, s % bs].clone()
    pad = slots < 0
    log_k[:, pad] = 0
    log_v[:, pad] = 0
    return log_k.view(key_cache.dtype), log_v.view(value_cache.dtype)


def restore_slots_reference(key_cache, value_cache, slots, log_k, log_v) -> None:
    nb, bs = key_cache.shape[1:3]
    rows = valid_slot_rows(slots, nb * bs)
    s = slots.long()[rows]
    raw(key_cache)[:, s // bs, s % bs] = raw(log_k)[:, rows]
    raw(value_cache)[:, s // bs, s % bs] = raw(log_v)[:, rows]


def log_slots(key_cache, value_cache, slots, *, backend: str | None = None, validate: bool = True,
              trusted: bool = False):
    """Return `(log_k, log_v)` `[L, n, H, D]`: raw contents of `slots` in every layer.
    `validate` / `trusted` as in `write_kv`."""
    num_layers, nb, bs, h, d = key_cache.shape
    if not trusted:
        _check_stacked(key_cache, value_cache)
        check_tensor("slots", slots, ndim=1, dtypes=INDEX_DTYPES, device=key_cache.device)
        check_slots("slots", slots, nb * bs, validate)
    if use_cuda(key_cache, backend):
        log_k = torch.empty((num_layers, slots.numel(), h, d), dtype=key_cache.dtype, device=key_cache.device)
        log_v = torch.empty_like(log_k)
        torch.ops.nwor_lab.log_slots(key_cache, value_cache, slots, log_k, log_v)
        return log_k, log_v
    return log_slots_reference(key_cache, value_cache, slots)


def restore_slots(key_cache, value_cache, slots, log_k, log_v, *, backend: str | None = None,
                  validate: bool = True, trusted: bool = False) -> None:
    """Copy `log_k`/`log_v` back into `slots` of every layer (slot -1 skipped).
    `validate` / `trusted` as in `write_kv`."""
    if not trusted:
        _check_restore_args(key_cache, value_cache, slots, log_k, log_v, validate)
    if use_cuda(key_cache, backend):
        torch.ops.nwor_lab.restore_slots(key_cache, value_cache, slots, log_k.contiguous(), log_v.contiguous())
        return
    restore_slots_reference(key_cache, value_cache, slots, log_k, log_v)


def _check_restore_args(key_cache, value_cache, slots, log_k, log_v, validate) -> None:
    num_layers, nb, bs, h, d = _check_stacked(key_cache, value_cache)
    check_tensor("slots", slots, ndim=1, dtypes=INDEX_DTYPES, device=key_cache.device)
    shape = (num_layers, slots.numel(), h, d)
    for name, log in (("log_k", log_k), ("log_v", log_v)):
        check_tensor(name, log, shape=shape, dtypes=(key_cache.dtype,), device=key_cache.device,
                     what="[num_layers, num_slots_logged, num_kv_heads, head_size] from log_slots")
    check_slots("slots", slots, nb * bs, validate, unique=True)
