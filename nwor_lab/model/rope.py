"""Rotary position embedding (Hugging Face "rotate half" convention), incl. Llama-3 scaling."""
from __future__ import annotations

import math

import torch

from nwor_lab.ops.fused import rope


def inv_frequencies(head_dim: int, theta: float, rope_scaling: dict | None = None) -> torch.Tensor:
    """`[head_dim // 2]` float32 inverse frequencies, scaled per `rope_scaling`.

    llama3: wavelengths longer than original_max / low_freq_factor are divided by `factor`,
    shorter than original_max / high_freq_factor kept, those between interpolated smoothly.
    """
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if not rope_scaling:
        return inv.float()
    kind = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    factor = float(rope_scaling.get("factor", 1.0))
    if kind == "linear":
        return (inv / factor).float()
    if kind == "llama3":
        low, high = float(rope_scaling["low_freq_factor"]), float(rope_scaling["high_freq_factor"])
        old = float(rope_scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        mid = (wavelen <= old / low) & (wavelen >= old / high)
        scaled = torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
        return scaled.float()
    return inv.float()


class Rotary(torch.nn.Module):
    """cos/sin from positions; `apply(x [T, heads, D], positions [T])`."""

    def __init__(self, head_dim: int, theta: float, rope_scaling: dict | None = None):
        super().__init__()
        self.register_buffer("inv_freq", inv_frequencies(head_dim, theta, rope_scaling), persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype):
        freqs = positions.float()[..., None] * self.inv_freq.to(positions.device)  # [..., D/2]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor | None = None):
        """x `[..., heads, D]`, cos/sin `[..., D]` (broadcast over heads) -> rotated x, written
        into `out` when given (zero-copy staging: the last op writes the staging buffer). The
        same ops run either way, so the result is bit-identical with and without `out`; for
        `[T, heads, D]` on CUDA at inference they are one Triton kernel (`nwor_lab.ops.fused`)."""
        return rope(x, cos, sin, out)
