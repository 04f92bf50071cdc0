"""fp8 quantisation shared by every reference that writes the cache (one rounding rule).

stored = fp8(clamp(float32(x) / scale, -fmax, fmax)): round to nearest even, saturating to the
largest finite value, exactly what the CUDA kernels do with `__NV_SATFINITE`.
"""
from __future__ import annotations

import torch

from nwor_lab.kv.cache import FP8_MAX

# Same-size integer dtypes: copying through them keeps raw bytes (NaN payloads included).
_RAW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def raw(t: torch.Tensor) -> torch.Tensor:
    """A same-storage integer view of `t`: byte-exact copies and comparisons."""
    return t.view(_RAW[t.element_size()])


def quantize(x: torch.Tensor, storage_dtype: torch.dtype, scale: torch.Tensor | None) -> torch.Tensor:
    """`x [n, H, D]` to the cache's storage dtype; `scale` broadcastable to `[H]` (fp8 only)."""
    if storage_dtype not in FP8_MAX:
        return x.to(storage_dtype)
    fmax = FP8_MAX[storage_dtype]
    s = scale.to(device=x.device, dtype=torch.float32).reshape(-1)[:, None]  # [1 or H, 1]
    return (x.float() / s).clamp(-fmax, fmax).to(storage_dtype)


def dequantize(q: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor | None) -> torch.Tensor:
    if q.dtype not in FP8_MAX:
        return q.to(dtype)
    s = scale.to(device=q.device, dtype=torch.float32).reshape(-1)[:, None]
    return (q.float() * s).to(dtype)
