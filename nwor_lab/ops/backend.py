"""Which implementation of the ops runs, and why.

CPU tensors always run the torch reference. CUDA tensors run the JIT-built extension when the
backend resolves to `cuda`: the requested backend (`LabConfig.backend`, which
`LabConfig.from_env` takes from `NWOR_LAB_BACKEND`) is `auto` (use the
extension if it builds and loads, else fall back to the reference with ONE warning that says why),
`cuda` (the extension is required: a build failure raises with the compiler's message) or `torch`.

The only process-wide state is the outcome of loading the extension, kept in `_ext` (a shared
library loads once per process); which backend a call uses is always decided from its arguments.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from nwor_lab.config import BACKENDS
from nwor_lab.ops import _ext


@dataclass(frozen=True)
class BackendInfo:
    name: str     # "cuda" or "torch"
    reason: str   # one sentence: why this one runs


_warned = False   # the one fallback warning of `auto` was given


def resolve(backend: str | None = None) -> str:
    """The requested backend: the argument (from `LabConfig.backend`), else `auto`. The environment
    is read once, by `LabConfig.from_env`, never per op call."""
    choice = (backend or "auto").strip().lower()
    if choice not in BACKENDS:
        raise ValueError(f"backend={choice!r}: choose one of {', '.join(BACKENDS)} (LabConfig.backend)")
    return choice


def backend(device=None, choice: str | None = None) -> BackendInfo:
    """Which implementation runs for tensors on `device` (default: CUDA if present, else CPU) when
    `choice` (auto / cuda / torch) is requested."""
    choice = resolve(choice)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type != "cuda":
        return BackendInfo("torch", f"tensors on {device.type} always use the torch reference")
    if not torch.cuda.is_available():
        return BackendInfo("torch", "CUDA is not available in this process")
    if choice == "torch":
        return BackendInfo("torch", "backend 'torch' was requested (LabConfig.backend or NWOR_LAB_BACKEND)")
    err = _ext.try_load()
    if err is None:
        return BackendInfo("cuda", "the nwor_lab CUDA extension is built and loaded")
    if choice == "cuda":
        raise RuntimeError(f"backend 'cuda' was requested but the extension failed to build/load: {err}") from err
    return BackendInfo("torch", f"the CUDA extension failed to build/load ({type(err).__name__}: "
                                f"{str(err).splitlines()[0] if str(err) else ''}); using the torch reference")


def use_cuda(t: torch.Tensor, choice: str | None = None) -> bool:
    """True when an op on tensor `t` should call the CUDA extension."""
    global _warned
    if not t.is_cuda:
        return False
    if _ext.is_loaded() and choice in ("auto", "cuda"):  # hot path: explicit choice, extension loaded
        return True
    info = backend(t.device, choice)
    if info.name == "torch" and resolve(choice) == "auto" and not _warned:
        _warned = True
        warnings.warn(f"nwor_lab: {info.reason}", RuntimeWarning, stacklevel=3)
    return info.name == "cuda"
