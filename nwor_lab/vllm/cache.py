"""vLLM's KV tensors as the lab's cache: which layer is which, and proof of the layout.

vLLM 0.32 binds one tensor per attention layer, `[num_blocks, num_kv_heads, block_size,
2 * head_size]` on CPU (`static_forward_context[name].kv_cache`). The lab numbers the target's
layers 0..N-1 and the EAGLE head's layer N, as its own engine does; vLLM names them
`model.layers.{i}.self_attn.attn` with the head's index continuing after the target's, so the
order of `extract_layer_index` is the lab's order.

The layout inside each (block, head) run is the CPU kernel's business, not the tensor's strides
(vLLM hands the backend a plain contiguous tensor). `probe_layout` therefore asks vLLM's own
write op to put known values into a scratch cache and checks that `kv.vllm_cpu_views` reads them
back where they belong; an ISA that packs differently (AMX) is refused in one line at start.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from nwor_lab.kv import KVLayout, PagedKVCache
from nwor_lab.kv.layout import vllm_cpu_views


@dataclass
class VllmCache:
    cache: PagedKVCache              # per-layer views over vLLM's tensors (no copy)
    layer_names: list[str]           # lab layer index -> vLLM layer name
    index: dict[str, int]            # vLLM layer name -> lab layer index
    num_target_layers: int           # layers of the target model (the head's come after)
    packed: list[torch.Tensor]       # vLLM's own tensors, per lab layer


def row_writer(packed: torch.Tensor, isa: str):
    """`write(key, value, slots)`: rows `[n, H, D]` into `packed` (one layer's
    `[num_blocks, H, BS, 2*D]`) at `slots` `[n]` int64 with vLLM's `cpu_attn_reshape_and_cache`
    (slot -1: skipped), the same bytes the lab's index-put stores (`probe_layout` checked it), in
    one C++ op instead of two strided scatters."""
    from vllm import _custom_ops as ops

    nb, h, bs, d2 = packed.shape
    key_cache, value_cache = packed.view(nb, h, 2 * bs, d2 // 2).chunk(2, dim=2)

    def write(key, value, slots):
        ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, isa, k_scale=1.0, v_scale=1.0,
                                       kv_cache_dtype="auto")
    return write


def probe_layout(layer, dtype: torch.dtype, num_kv_heads: int, head_size: int) -> None:
    """Raise unless vLLM's CPU write (`cpu_attn_reshape_and_cache` with `layer.isa`) stores K and V
    where `vllm_cpu_views` reads them. Uses a 2-block scratch cache, never vLLM's."""
    from vllm import _custom_ops as ops

    bs = 32
    packed = torch.zeros(2, num_kv_heads, bs, 2 * head_size, dtype=dtype)
    as_rows = packed.view(2, num_kv_heads, 2 * bs, head_size)
    key_cache, value_cache = as_rows.chunk(2, dim=2)          # what the backend hands the op
    n = 3
    key = (torch.arange(n * num_kv_heads * head_size, dtype=torch.float32) % 251 + 1).view(n, num_kv_heads, head_size)
    key, value = key.to(dtype), (-key).to(dtype)
    slots = torch.tensor([0, bs + 1, bs - 1], dtype=torch.int64)
    ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, layer.isa,
                                   k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto")
    k_view, v_view = vllm_cpu_views(packed)
    got_k = k_view[slots // bs, slots % bs]
    got_v = v_view[slots // bs, slots % bs]
    if not (torch.equal(got_k, key) and torch.equal(got_v, value)):
        raise RuntimeError(f"nwor_lab.vllm: vLLM's CPU kernels (isa {layer.isa!r}) store K/V in a layout the lab "
                           f"does not read (kv.vllm_cpu_views); the plugin supports the 'vec' kernels of "
                           f"vllm-cpu 0.32 (block_size a multiple of 32, no AMX)")


def build(runner, model_dtype: torch.dtype) -> VllmCache:
    """The lab's view of `runner`'s KV tensors, after `initialize_kv_cache`."""
    from vllm.model_executor.models.utils import extract_layer_index

    ctx = runner.compilation_config.static_forward_context
    attn = {name: mod for name, mod in ctx.items() if isinstance(getattr(mod, "kv_cache", None), torch.Tensor)}
    if not attn:
        raise RuntimeError("nwor_lab.vllm: the runner has no attention layers with a KV cache")
    names = sorted(attn, key=extract_layer_index)
    tensors = [attn[name].kv_cache for name in names]
    if len({t.data_ptr() for t in tensors}) != len(tensors):
        raise RuntimeError("nwor_lab.vllm: two layers share one KV tensor (KV sharing); the plugin needs one "
                           "tensor per layer")
    first = tensors[0]
    if first.dim() != 4 or first.device.type != "cpu":
        raise RuntimeError(f"nwor_lab.vllm: expected vLLM's CPU KV tensors [num_blocks, num_kv_heads, block_size, "
                           f"2 * head_size], got {tuple(first.shape)} on {first.device}")
    if first.dtype != model_dtype:
        raise RuntimeError(f"nwor_lab.vllm: the KV cache is {first.dtype} and the model {model_dtype}; the plugin "
                           f"supports kv_cache_dtype='auto' only (an fp8 cache is not adapted)")
    layer0 = attn[names[0]]
    probe_layout(layer0, first.dtype, first.shape[1], first.shape[3] // 2)
    views = [vllm_cpu_views(t) for t in tensors]
    cache = PagedKVCache.from_layers([k for k, _ in views], [v for _, v in views], dtype=model_dtype,
                                     layout=KVLayout.VLLM_CPU)
    # the policies' writes, commits and restores (and the staging blocks' rows) with vLLM's own op
    cache.native_writers = [row_writer(t, attn[name].isa) for name, t in zip(names, tensors)]
    target = runner.model_config.get_num_layers(runner.parallel_config)
    return VllmCache(cache, names, {n: i for i, n in enumerate(names)}, target, tensors)
