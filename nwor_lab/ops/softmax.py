"""The sampler's softmax at a temperature: `softmax(logits.float() / t)` row by row.

    temperature_softmax(logits [n, V], temperature [n] fp32 | float) -> [n, V] fp32 probabilities

Why: at T > 0 every speculative step forms the target's probabilities over the verified rows and the
bonus rows, and the head's over each drafted position (six softmaxes over [64..256, 128256] in an 8B
step at batch 64). In torch each is a float copy of the logits, an in-place division and a softmax
whose one block per row leaves most SMs idle: 1.1 of the 1.9 ms that T 0.8 added to the graphed 8B
step at batch 64 on an H200 (`benchmarks/results/t08_kernels_8b_h200.json`). The Triton kernels
(`_softmax_triton`) split each row into chunks and read the logits in their own dtype.

Numbers: the same math in fp32; the chunked sums add in another order and Triton's exp is not
torch's, so the probabilities differ from the reference by a few fp32 ulps (tests bound it). Every
path of one device takes the same kernels (target and head, eager and graphed), so a draft whose
head and target logits agree still leaves a zero residual, and seeded runs stay reproducible.

Backends as `nwor_lab.ops.fused`: CUDA tensors take the kernels when triton imports; CPU tensors the
reference (or the kernels under TRITON_INTERPRET=1, as the tests run them).
"""
from __future__ import annotations

import torch

from nwor_lab._checks import FLOAT_DTYPES, check_tensor
from nwor_lab.ops._lazy import LazyModule
from nwor_lab.ops.fused import use_fused

__all__ = ["temperature_softmax", "temperature_softmax_reference"]

_kernels = LazyModule("nwor_lab.ops._softmax_triton")


def _per_row(temperature, logits: torch.Tensor) -> torch.Tensor:
    if isinstance(temperature, torch.Tensor):
        check_tensor("temperature", temperature, shape=(logits.shape[0],), dtypes=(torch.float32,),
                     device=logits.device, what="[n] fp32 temperature per row (> 0)")
        return temperature
    t = float(temperature)
    if not t > 0:
        raise ValueError(f"temperature={temperature}: a softmax at a temperature needs t > 0 (greedy rows take "
                         f"argmax of the logits instead)")
    return torch.full((logits.shape[0],), t, dtype=torch.float32, device=logits.device)


def temperature_softmax_reference(logits: torch.Tensor, temperature) -> torch.Tensor:
    """torch's softmax of the float logits divided by each row's temperature (the sampler's math)."""
    t = _per_row(temperature, logits)
    x = logits.float()
    # in place only on a copy: fp32 logits' .float() is the caller's tensor itself
    return torch.softmax(x / t[:, None] if x is logits else x.div_(t[:, None]), dim=-1)


def temperature_softmax(logits: torch.Tensor, temperature) -> torch.Tensor:
    """logits `[n, V]`, temperature a float or `[n]` fp32 (each > 0) -> `[n, V]` fp32 (module docstring)."""
    check_tensor("logits", logits, ndim=2, dtypes=FLOAT_DTYPES, what="[n, V] logits")
    if not use_fused(logits) or _kernels.get() is None:
        return temperature_softmax_reference(logits, temperature)
    return _kernels.module.temperature_softmax(logits, _per_row(temperature, logits))
