"""Argument checks that name the argument and say how to fix it.

Every public op and policy method validates its inputs with these before touching a cache, so a
bad call raises before anything is written (no half-written windows).
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch

INDEX_DTYPES = (torch.int32, torch.int64)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_tensor(name: str, t, *, ndim: int | None = None, shape: Sequence | None = None,
                 dtypes: Iterable[torch.dtype] | None = None, device: torch.device | None = None,
                 what: str = "") -> torch.Tensor:
    """Raise TypeError/ValueError naming `name` unless `t` is a tensor of the given form.

    `shape` may hold None for "any size" in a dimension; `what` describes the expected shape in
    domain words for the message (e.g. "[num_tokens, num_kv_heads, head_size]"). This runs on every
    op call, so the passing path does no string work (messages are built only on failure).
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor{_hint(what)}, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor{_hint(what)}, got shape {tuple(t.shape)}")
    if shape is not None:
        got = t.shape
        if len(got) != len(shape) or any(s is not None and s != d for s, d in zip(shape, got)):
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise ValueError(f"{name}: expected shape {want}{_hint(what)}, got {tuple(got)}")
    if dtypes is not None and t.dtype not in dtypes:
        dtypes = tuple(dtypes)
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name}: dtype {str(t.dtype).replace('torch.', '')} is not supported; "
                        f"use one of {names} (e.g. {name}.to({dtypes[0]}))")
    if device is not None and t.device != device and not same_device(t.device, device):
        raise ValueError(f"{name}: is on {t.device} but must be on {device} with the cache; "
                         f"move it with {name}.to({str(device)!r})")
    return t


def check_whole(name: str, t) -> None:
    """Counts (accepted lengths, ...) are whole numbers: a float tensor would be truncated by the
    cast the kernels make (1.7 -> 1), so it is refused, naming the values."""
    if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()):
        raise TypeError(f"{name}: {str(t.dtype).replace('torch.', '')} values {t.flatten()[:4].tolist()}; these are "
                        f"counts of drafts, whole numbers in int32/int64 (a cast would truncate 1.7 to 1)")


def _hint(what: str) -> str:
    return f" {what}" if what else ""


def same_device(a, b) -> bool:
    """`cuda` and `cuda:0` are the same device when 0 is current (torch.device compares them unequal)."""
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    if a.type != "cuda" or a.index == b.index:
        return True
    current = torch.cuda.current_device()
    return (current if a.index is None else a.index) == (current if b.index is None else b.index)


def capturing() -> bool:
    """True while a CUDA graph is being captured: host-side checks must not sync then."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def check_slots(name: str, slots: torch.Tensor, num_slots: int, validate: bool = True,
                unique: bool = False) -> None:
    """Slots must be -1 (write nothing) or in [0, num_slots); with `unique`, no slot twice.

    One host sync when validating; skipped under CUDA-graph capture (kernels skip bad slots).
    """
    check_tensor(name, slots, ndim=1, dtypes=INDEX_DTYPES, what="[num_tokens] slot ids")
    if not validate or slots.numel() == 0 or capturing():
        return
    lo, hi = int(slots.min()), int(slots.max())
    if lo < -1 or hi >= num_slots:
        bad = slots[(slots < -1) | (slots >= num_slots)][:4].tolist()
        raise ValueError(f"{name}: slot ids {bad} are outside the cache; valid slots are -1 "
                         f"(padding) and 0..{num_slots - 1} (= num_blocks * block_size - 1)")
    if unique:
        real = slots[slots >= 0]
        if real.numel() != torch.unique(real).numel():
            raise ValueError(f"{name}: the same slot appears twice; each token needs its own slot "
                             f"(which write wins would be undefined)")


def check_cache_source(src_name: str, src: torch.Tensor, cache: torch.Tensor, k_scale, v_scale,
                       scale_ok, scale_shape: str, scale_hint: str) -> None:
    """The source/cache dtype rule every cache-writing op shares.

    fp8 cache: float32 scales are required, `scale_ok(t) -> bool` says if a scale's shape fits
    (`scale_shape` describes it). Any other cache stores the model dtype: the source must match.
    """
    from nwor_lab.kv.cache import is_fp8
    if not is_fp8(cache.dtype):
        if src.dtype != cache.dtype:
            raise TypeError(f"{src_name}: dtype {src.dtype} differs from the cache's {cache.dtype}; a non-fp8 "
                            f"cache stores the model dtype ('auto'): cast with {src_name}.to({cache.dtype})")
        return
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is None:
            raise ValueError(f"{name}: an fp8 cache needs float32 scales {scale_shape}; use {scale_hint}")
        check_tensor(name, scale, dtypes=(torch.float32,), device=cache.device)
        if not scale_ok(scale):
            raise ValueError(f"{name}: expected {scale_shape}, got shape {tuple(scale.shape)}")


def check_index(name: str, value, lo: int, hi: int, what: str = "") -> int:
    """An integer index (Python, numpy or 0-d torch int; never a bool or float) in `[lo, hi)` -> int.
    For layer numbers, token offsets and the like: `np.int64(3)` is 3, `3.0` is refused by name."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name}={value!r}: expected an integer{_hint(what)}, got {type(value).__name__}")
    i = value.__index__()
    if not lo <= i < hi:
        raise IndexError(f"{name}={i}: must be in {lo}..{hi - 1}{_hint(what)}")
    return i


def check_sampled_rows(sampled_token_ids, num_reqs: int, source: str = "the window") -> None:
    """The rejection sampler's output has one row per request of `source`; say so in those words
    (a wrong row count is the caller's sampled ids, never a cumsum the caller did not pass)."""
    check_tensor("sampled_token_ids", sampled_token_ids, ndim=2, dtypes=INDEX_DTYPES,
                 what="[num_reqs, max_spec_len + 1] sampled ids from the rejection sampler")
    if sampled_token_ids.shape[0] != num_reqs:
        raise ValueError(f"sampled_token_ids: has {sampled_token_ids.shape[0]} rows but {source} has "
                         f"{num_reqs} requests; the rejection sampler returns one row per request "
                         f"([num_reqs, max_spec_len + 1])")


def check_device(name: str, device) -> torch.device:
    """`device` as a torch.device that exists in this process, or a ValueError naming `name`."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"{name}={device!r}: not a torch device; use e.g. cpu, cuda or cuda:1") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA device is visible"
            raise ValueError(f"{name}={device!r}: CUDA is not available ({why}); use {name}=cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{name}={device!r}: there are {torch.cuda.device_count()} CUDA devices "
                             f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")
    elif dev.type != "cpu":      # meta tensors hold no data; mps, xpu, ... have no kernels here
        raise ValueError(f"{name}={device!r}: the lab runs on cpu or cuda (cuda:N)")
    return dev


def check_backend_device(backend: str, device) -> None:
    """Backend `cuda` means "the CUDA extension runs every op": on tensors that are not on a CUDA
    device it would be ignored (the torch reference would run), so refuse instead."""
    dev = torch.device(device)
    if backend == "cuda" and dev.type != "cuda":
        where = "" if torch.cuda.is_available() else " and CUDA is not available here"
        raise ValueError(f"backend='cuda' (LabConfig.backend / NWOR_LAB_BACKEND) needs a CUDA device, but "
                         f"this runs on {dev}{where}; use backend 'auto' or 'torch', or a CUDA device")
