"""The Triton kernels behind `nwor_lab.ops.fused` (imported lazily: the package never needs triton).

Each kernel computes in fp32 and rounds to the tensor dtype exactly where torch's element-wise ops
round (`_cast`, shared with the verify-attention kernels, also fixes the interpreter's truncating
bf16 cast), so the results match the torch reference (see nwor_lab.ops.fused).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from nwor_lab.ops._verify_attention_triton import _cast

INTERPRETED = type(_cast).__name__ == "InterpretedFunction"


def _fix_bf16(dtype: torch.dtype) -> bool:
    return INTERPRETED and dtype == torch.bfloat16


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride_x, stride_o, D, eps,
                     BLOCK: tl.constexpr, FIX_X: tl.constexpr, FIX_OUT: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < D
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0)
    xf = x.to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / D + eps)
    y = _cast(xf * r, x_ptr.dtype.element_ty, FIX_X)                 # .to(x.dtype)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    out = _cast(w.to(tl.float32) * y.to(tl.float32), out_ptr.dtype.element_ty, FIX_OUT)
    tl.store(out_ptr + row * stride_o + cols, out, mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    shape = x.shape
    D = shape[-1]
    x2 = x.reshape(-1, D)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    if x2.shape[0]:
        block = triton.next_power_of_2(D)
        _rms_norm_kernel[(x2.shape[0],)](x2, weight.contiguous(), out, x2.stride(0), out.stride(0), D, eps,
                                         BLOCK=block, FIX_X=_fix_bf16(x.dtype), FIX_OUT=_fix_bf16(out.dtype),
                                         num_warps=4 if block <= 2048 else 8)
    return out.view(shape)


@triton.jit
def _rope_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, stride_xt, stride_xh, stride_ot, stride_oh,
                 stride_ct, stride_st, H, HALF: tl.constexpr, BLOCK_H: tl.constexpr, FIX_BF16: tl.constexpr):
    """One program per token: every head, both halves of the head dimension."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, HALF)
    ok = (h < H)[:, None]
    dtype = x_ptr.dtype.element_ty
    xa = x_ptr + t * stride_xt + h[:, None] * stride_xh + d[None, :]
    x1 = tl.load(xa, mask=ok, other=0.0).to(tl.float32)             # first half
    x2 = tl.load(xa + HALF, mask=ok, other=0.0).to(tl.float32)      # second half
    c1 = tl.load(cos_ptr + t * stride_ct + d).to(tl.float32)[None, :]
    c2 = tl.load(cos_ptr + t * stride_ct + HALF + d).to(tl.float32)[None, :]
    s1 = tl.load(sin_ptr + t * stride_st + d).to(tl.float32)[None, :]
    s2 = tl.load(sin_ptr + t * stride_st + HALF + d).to(tl.float32)[None, :]
    # torch: x * cos (rounded), rotate_half(x) * sin (rounded), their sum (rounded)
    o1 = _cast(_cast(x1 * c1, dtype, FIX_BF16).to(tl.float32) + _cast(-x2 * s1, dtype, FIX_BF16).to(tl.float32),
               dtype, FIX_BF16)
    o2 = _cast(_cast(x2 * c2, dtype, FIX_BF16).to(tl.float32) + _cast(x1 * s2, dtype, FIX_BF16).to(tl.float32),
               dtype, FIX_BF16)
    oa = out_ptr + t * stride_ot + h[:, None] * stride_oh + d[None, :]
    tl.store(oa, o1, mask=ok)
    tl.store(oa + HALF, o2, mask=ok)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    T, H, D = x.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    cos = cos if cos.stride(-1) == 1 else cos.contiguous()
    sin = sin if sin.stride(-1) == 1 else sin.contiguous()
    if out is None:
        out = torch.empty_like(x)
    if out.stride(-1) != 1:
        raise ValueError("out: head_size must be the contiguous dimension")
    if T:
        _rope_kernel[(T,)](x, cos, sin, out, x.stride(0), x.stride(1), out.stride(0), out.stride(1),
                           cos.stride(0), sin.stride(0), H, HALF=D // 2, BLOCK_H=triton.next_power_of_2(H),
                           FIX_BF16=_fix_bf16(x.dtype), num_warps=1 if H * D <= 1024 else 4)
    return out


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, out_ptr, N, BLOCK: tl.constexpr, FIX_BF16: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = i < N
    g = tl.load(g_ptr + i, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + i, mask=ok, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    s = _cast(g / (1.0 + tl.exp(-g)), dtype, FIX_BF16)               # F.silu, rounded
    tl.store(out_ptr + i, _cast(s.to(tl.float32) * u, dtype, FIX_BF16), mask=ok)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    gate, up = gate.contiguous(), up.contiguous()
    out = torch.empty_like(gate)
    n = gate.numel()
    if n:
        block = 1024
        _silu_mul_kernel[(triton.cdiv(n, block),)](gate, up, out, n, BLOCK=block,
                                                   FIX_BF16=_fix_bf16(gate.dtype), num_warps=4)
    return out
