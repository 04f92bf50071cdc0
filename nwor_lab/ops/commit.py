"""commit: write the accepted rows of a staged window into every layer's cache, in one launch.

    staged_key, staged_value  [L, Tcap, H, D]     the window's K/V per layer (rows 0..T-1 used)
    key_cache, value_cache    [L, NB, BS, H, D]   stacked cache, logical NHD, or a list of L
                                                  [NB, BS, H, D] tensors (per-layer caches, as vLLM
                                                  holds them; `layer_ptrs` as in `nwor_lab.ops.slots`)
    slot_mapping              [T]                 the window's slots (-1 = padding)
    commit_mask               [T] bool            True for tokens to keep (from SCV)
    k_scale, v_scale          [L, H] float32      fp8 caches only

Masking is done in data (a rejected row behaves like slot -1), so no host sync is needed to
compact the accepted rows, and the op can be captured in a CUDA graph.

Row t goes to `slot_mapping[t]`: the op takes (source row, destination slot) pairs, so a tree
window's commit (nwor_lab.speculative.tree_window) is this op with the window's `commit_slots` (position n + depth):
the accepted path lands compacted at n + 1 .. n + a in the same one launch. Only kept rows need
distinct slots (rejected siblings share a depth, hence a destination).
"""
from __future__ import annotations

import torch

from nwor_lab._checks import FLOAT_DTYPES, INDEX_DTYPES, check_cache_source, check_slots, check_tensor
from nwor_lab.ops.backend import use_cuda
from nwor_lab.ops.slots import check_caches, first_layer, is_layer_list, resolve_layer_ptrs
from nwor_lab.ops.write_kv import slot_destination, write_rows


def commit_reference(staged_key, staged_value, key_cache, value_cache, slot_mapping, commit_mask,
                     k_scale=None, v_scale=None) -> None:
    """Layer by layer: `write_kv_reference` of the kept rows (a rejected row becomes slot -1), the
    slot arithmetic done once for all layers. `key_cache[layer]` is the same `[NB, BS, H, D]`
    tensor for a stacked cache and for a list."""
    t = slot_mapping.numel()
    slots = torch.where(commit_mask, slot_mapping.long(), torch.full_like(slot_mapping, -1, dtype=torch.long))
    nb, bs = key_cache[0].shape[:2]
    dest = slot_destination(slots, nb * bs, bs)
    for layer in range(len(key_cache)):
        write_rows(staged_key[layer, :t], staged_value[layer, :t], key_cache[layer], value_cache[layer], dest,
                   None if k_scale is None else k_scale[layer], None if v_scale is None else v_scale[layer])


def commit(staged_key, staged_value, key_cache, value_cache, slot_mapping, commit_mask,
           k_scale=None, v_scale=None, *, layer_ptrs: torch.Tensor | None = None, backend: str | None = None,
           validate: bool = True, trusted: bool = False) -> None:
    """Write rows `t` with `commit_mask[t]` of every layer into the cache (see module doc).
    `validate` / `trusted` as in `write_kv`."""
    if not trusted:
        _check_commit_args(staged_key, staged_value, key_cache, value_cache, slot_mapping, commit_mask,
                           k_scale, v_scale, validate)
    if use_cuda(first_layer(key_cache), backend):
        if is_layer_list(key_cache):
            table = resolve_layer_ptrs(key_cache, value_cache, layer_ptrs, validate and not trusted)
            torch.ops.nwor_lab.commit.layers(staged_key, staged_value, list(key_cache), list(value_cache), table,
                                             slot_mapping, commit_mask, k_scale, v_scale)
        else:
            torch.ops.nwor_lab.commit(staged_key, staged_value, key_cache, value_cache, slot_mapping, commit_mask,
                                      k_scale, v_scale)
        return
    commit_reference(staged_key, staged_value, key_cache, value_cache, slot_mapping, commit_mask, k_scale, v_scale)


def _check_commit_args(staged_key, staged_value, key_cache, value_cache, slot_mapping, commit_mask,
                       k_scale, v_scale, validate) -> None:
    num_layers, nb, bs, h, d = check_caches(key_cache, value_cache)
    ref = first_layer(key_cache)
    dev = ref.device
    check_tensor("slot_mapping", slot_mapping, ndim=1, dtypes=INDEX_DTYPES, device=dev)
    t = slot_mapping.numel()
    check_tensor("staged_key", staged_key, shape=(num_layers, None, h, d), dtypes=FLOAT_DTYPES, device=dev,
                 what="[num_layers, capacity, num_kv_heads, head_size]")
    check_tensor("staged_value", staged_value, shape=tuple(staged_key.shape), dtypes=(staged_key.dtype,),
                 device=dev, what="(same as staged_key)")
    if staged_key.shape[1] < t:
        raise ValueError(f"staged_key: holds {staged_key.shape[1]} rows but slot_mapping has {t} tokens")
    check_tensor("commit_mask", commit_mask, shape=(t,), dtypes=(torch.bool,), device=dev,
                 what="[num_tokens] bool, one per slot_mapping entry")
    check_cache_source("staged_key", staged_key, ref, k_scale, v_scale,
                       lambda sc: tuple(sc.shape) == (num_layers, h), f"[num_layers={num_layers}, num_kv_heads={h}]",
                       "PagedKVCache.k_scale / v_scale")
    # only the rows that are written must not collide (a tree's rejected siblings share a destination)
    check_slots("slot_mapping", slot_mapping.masked_fill(~commit_mask, -1), nb * bs, validate, unique=True)
    check_slots("slot_mapping", slot_mapping, nb * bs, validate)
