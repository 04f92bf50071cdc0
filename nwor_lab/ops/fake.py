"""Fake (meta) implementations of the `torch.ops.nwor_lab.*` CUDA ops, for torch.compile / export.

Every op mutates tensors it is given (`Tensor(a!)` in the schema) and returns nothing, so the fake
implementation only has to return None: shapes of outputs are the shapes of the buffers passed in.
The C++ library names this module (`m.set_python_module("nwor_lab.ops.fake")`), so torch imports it
on first fake use; `nwor_lab.ops._ext.load()` also imports it. Registering before the library is
loaded is fine: torch keeps the fake impl by name.
"""
from __future__ import annotations

import torch


@torch.library.register_fake("nwor_lab::write_kv")
def _write_kv_fake(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale) -> None:
    return None


@torch.library.register_fake("nwor_lab::log_slots")
def _log_slots_fake(key_cache, value_cache, slots, log_k, log_v) -> None:
    return None


@torch.library.register_fake("nwor_lab::restore_slots")
def _restore_slots_fake(key_cache, value_cache, slots, log_k, log_v) -> None:
    return None


@torch.library.register_fake("nwor_lab::commit")
def _commit_fake(staged_key, staged_value, key_cache, value_cache, slot_mapping, commit_mask,
                 k_scale, v_scale) -> None:
    return None


@torch.library.register_fake("nwor_lab::commit.layers")
def _commit_layers_fake(staged_key, staged_value, key_caches, value_caches, layer_ptrs, slot_mapping,
                        commit_mask, k_scale, v_scale) -> None:
    return None


@torch.library.register_fake("nwor_lab::log_slots.layers")
def _log_slots_layers_fake(key_caches, value_caches, layer_ptrs, slots, log_k, log_v) -> None:
    return None


@torch.library.register_fake("nwor_lab::restore_slots.layers")
def _restore_slots_layers_fake(key_caches, value_caches, layer_ptrs, slots, log_k, log_v) -> None:
    return None


@torch.library.register_fake("nwor_lab::scv_mask")
def _scv_mask_fake(draft_token_ids, cu_num_draft_tokens, sampled_token_ids, token_req, token_draft_pos,
                   draft_mask, accepted_len, commit_mask) -> None:
    return None


@torch.library.register_fake("nwor_lab::noop")
def _noop_fake(x) -> None:
    return None
