"""KV cache layouts, told apart by strides.

Every cache tensor is indexed LOGICALLY as NHD — `[..., num_blocks, block_size, num_kv_heads,
head_size]` — whatever its physical order. `HND` stores `[..., num_blocks, num_kv_heads,
block_size, head_size]` in memory and exposes the logical order as a permuted view (vLLM's flash
backend does the same). Shape alone cannot tell the two apart when block_size == num_kv_heads,
so `detect_layout` reads the strides of the (block_size, num_kv_heads) dimensions.
"""
from __future__ import annotations

from enum import Enum

import torch


class KVLayout(str, Enum):
    NHD = "NHD"
    HND = "HND"


def detect_layout(cache: torch.Tensor) -> KVLayout:
    """Layout of a logical-NHD cache view `[..., NB, BS, H, D]` from its strides.

    NHD: head rows inside a slot, slots inside a block: stride(H) >= D, stride(BS) >= H * stride(H),
         stride(NB) >= BS * stride(BS).
    HND: slot rows inside a head, heads inside a block: stride(BS) >= D, stride(H) >= BS * stride(BS),
         stride(NB) >= H * stride(H).
    Rows may be padded (vLLM 0.33's flash cache packs K and V in one `[NB, H, BS, 2D]` tensor per
    layer: its K view has stride(BS) = 2D); the kernels take every stride as it is. Anything else
    (e.g. a non-contiguous head_size) is rejected.
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
    raise ValueError(f"cache: strides {tuple(cache.stride())} for shape {tuple(cache.shape)} are "
                     f"neither NHD nor HND; allocate it with nwor_lab.kv.PagedKVCache")


def allocate(shape_nhd: tuple[int, ...], layout: KVLayout | str, dtype: torch.dtype,
             device) -> torch.Tensor:
    """Allocate a cache whose logical shape is `shape_nhd` (`[..., NB, BS, H, D]`) in `layout`."""
    layout = KVLayout(layout)
    if layout is KVLayout.NHD:
        return torch.zeros(shape_nhd, dtype=dtype, device=device)
    *lead, bs, h, d = shape_nhd
    physical = torch.zeros((*lead, h, bs, d), dtype=dtype, device=device)
    return physical.transpose(-3, -2)
