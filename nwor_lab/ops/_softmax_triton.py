"""The Triton kernels behind `nwor_lab.ops.softmax` (imported lazily: the package never needs triton).

A sampler's softmax has few rows and a long vocabulary (64 rows of 128,256 at the 8B shape): torch's
softmax gives each row one block, so 64 blocks walk 128k columns on a 132-SM card, after a float copy
of the logits and a division by the temperature, each a pass of its own over [n, V] fp32. Here the
columns are split into chunks of BLOCK, two launches of (rows x chunks) programs:

    _partials:   each chunk's max and sum of exp(x / t - max)              -> [n, C] fp32 each
    _normalize:  each chunk reads its row's C partials (the row's max M and sum Z), then writes
                 exp(x / t - M) / Z                                         -> [n, V] fp32

so the logits are read twice in their own dtype and the probabilities written once.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096


@triton.jit
def _partials_kernel(x_ptr, t_ptr, m_ptr, s_ptr, stride_x, V, C, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    cols = c * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride_x + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
    x = x / tl.load(t_ptr + row)
    m = tl.max(x, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)          # a chunk of -inf logits adds 0, not NaN
    tl.store(m_ptr + row * C + c, m)
    tl.store(s_ptr + row * C + c, tl.sum(tl.exp(x - m_safe), 0))


@triton.jit
def _normalize_kernel(x_ptr, t_ptr, m_ptr, s_ptr, out_ptr, stride_x, stride_o, V, C,
                      BLOCK: tl.constexpr, CBLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    parts = tl.arange(0, CBLOCK)
    ms = tl.load(m_ptr + row * C + parts, mask=parts < C, other=float("-inf"))
    ss = tl.load(s_ptr + row * C + parts, mask=parts < C, other=0.0)
    big = tl.max(ms, 0)
    z = tl.sum(tl.where(ms == float("-inf"), 0.0, ss * tl.exp(ms - big)), 0)
    cols = c * BLOCK + tl.arange(0, BLOCK)
    ok = cols < V
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=float("-inf")).to(tl.float32)
    x = x / tl.load(t_ptr + row)
    tl.store(out_ptr + row * stride_o + cols, tl.exp(x - big) / z, mask=ok)


def temperature_softmax(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """logits `[n, V]` (any float dtype, unit column stride), temperature `[n]` fp32 -> `[n, V]` fp32."""
    n, vocab = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    out = torch.empty((n, vocab), dtype=torch.float32, device=logits.device)
    if n == 0 or vocab == 0:
        return out
    chunks = triton.cdiv(vocab, BLOCK)
    m = torch.empty((n, chunks), dtype=torch.float32, device=logits.device)
    s = torch.empty_like(m)
    t = temperature.contiguous()
    _partials_kernel[(n, chunks)](logits, t, m, s, logits.stride(0), vocab, chunks, BLOCK=BLOCK, num_warps=8)
    _normalize_kernel[(n, chunks)](logits, t, m, s, out, logits.stride(0), out.stride(0), vocab, chunks,
                                   BLOCK=BLOCK, CBLOCK=triton.next_power_of_2(chunks), num_warps=8)
    return out
