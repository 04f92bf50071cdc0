"""Fused element-wise ops of a Llama layer: RMSNorm, rotate-half RoPE, SwiGLU's silu(gate) * up.

    rms_norm(x [N, D], weight [D], eps)        -> weight * (x.float() * rsqrt(mean(x^2) + eps)).to(x.dtype)
    rope(x [T, H, D], cos [T, D], sin [T, D])  -> x * cos + rotate_half(x) * sin   (cos/sin per token)
    silu_mul(gate [N, I], up [N, I])           -> silu(gate) * up

Why: at decode sizes a layer is launch-bound, and in torch these are 8, 5 and 2 kernels (RMSNorm's
cast, pow, mean, add, rsqrt, mul, cast, mul; RoPE's neg, cat, two muls and an add): about half
the kernels of a layer of the shipped pair, each ~1.3 us inside a CUDA graph and tens of us of
host time eager. Each op here is one Triton kernel.

Numbers: each op rounds where torch rounds (products and sums of x's dtype are rounded to it
one by one, as torch's element-wise kernels do). Under Triton's CPU interpreter `rope` and
`silu_mul` give torch's bits in bf16/fp16 and `rms_norm` is within an ulp (its fp32 sum of
squares is added in another order). Compiled for an H100 they differed from torch by up to 2 ulps
in bf16/fp16 (fp32: a few 1e-7 where RoPE's two products cancel), which tests/gpu bounds. Every path of one device uses the same
kernels, so greedy tokens stay identical across write policies and graphed/eager steps.

Backends: the Triton kernels run for CUDA tensors when triton imports and no autograd graph is
being recorded (training, `forward_dense` with grad, keeps the torch reference, which has a
backward); CPU tensors take the reference, or the kernels under Triton's interpreter
(TRITON_INTERPRET=1 set before triton is first imported, as the tests do).
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from nwor_lab._checks import FLOAT_DTYPES, check_tensor
from nwor_lab.ops._lazy import LazyModule

__all__ = ["rms_norm", "rope", "silu_mul", "rms_norm_reference", "rope_reference", "silu_mul_reference",
           "use_fused"]

_kernels = LazyModule("nwor_lab.ops._fused_triton")   # imported once a CUDA tensor needs it


def use_fused(*tensors: torch.Tensor) -> bool:
    """Whether the Triton kernels run for these tensors (see the module docstring)."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return False
    t = tensors[0]
    if t.device.type != "cuda":
        # CPU tensors reach the kernels only under Triton's interpreter (the tests)
        kernels = _kernels.get() if t.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1" else None
        return kernels is not None and kernels.INTERPRETED
    return _kernels.get() is not None


# -- references (the model's own math, any device) ---------------------------------------------
def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor | None = None):
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return torch.add(x * cos.unsqueeze(-2), rot * sin.unsqueeze(-2), out=out)


def silu_mul_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


# -- the ops ------------------------------------------------------------------------------------
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x `[..., D]`, weight `[D]` -> `[..., D]` in promote(weight, x) dtype (see the module doc)."""
    if not use_fused(x, weight) or x.shape[-1] > 16384:
        return rms_norm_reference(x, weight, eps)
    check_tensor("x", x, dtypes=FLOAT_DTYPES)
    check_tensor("weight", weight, shape=(x.shape[-1],), dtypes=FLOAT_DTYPES, device=x.device)
    return _kernels.module.rms_norm(x, weight, float(eps))


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x `[T, H, D]`, cos/sin `[T, D]` -> `[T, H, D]`, into `out` when given (zero-copy staging:
    the rotated keys land in the staging buffer)."""
    if not use_fused(x, cos, sin) or x.dim() != 3 or cos.dim() != 2 or x.shape[-1] % 2 \
            or cos.dtype != x.dtype or sin.dtype != x.dtype:
        return rope_reference(x, cos, sin, out)
    T, H, D = x.shape
    check_tensor("cos", cos, shape=(T, D), device=x.device)
    check_tensor("sin", sin, shape=(T, D), device=x.device)
    if out is not None:
        check_tensor("out", out, shape=(T, H, D), dtypes=(x.dtype,), device=x.device)
    return _kernels.module.rope(x, cos, sin, out)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gate, up `[..., I]` (same shape and dtype) -> silu(gate) * up."""
    if not use_fused(gate, up) or gate.shape != up.shape or gate.dtype != up.dtype:
        return silu_mul_reference(gate, up)
    return _kernels.module.silu_mul(gate, up)
