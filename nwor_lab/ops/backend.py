"""Which implementation of the ops runs, and why.

CPU tensors always run the torch reference. CUDA tensors run the JIT-built extension when the
backend resolves to `cuda`: `NWOR_LAB_BACKEND` (or an explicit `backend=`) is `auto` (use the
extension if it builds and loads, else fall back to the reference with ONE warning that says why),
`cuda` (the extension is required: a build failure raises with the compiler's message) or `torch`.

The only process-wide state is the outcome of loading the extension (a shared library can be
loaded once per process); which backend a call uses is always decided from its arguments.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch

from nwor_lab.config import BACKENDS


@dataclass(frozen=True)
class BackendInfo:
    name: str     # "cuda" or "torch"
    reason: str   # one sentence: why this one runs


_load_error: Exception | None = None
_loaded = False
_warned = False


def resolve(backend: str | None = None) -> str:
    """The requested backend: the argument, else NWOR_LAB_BACKEND, else `auto`."""
    choice = (backend or os.environ.get("NWOR_LAB_BACKEND") or "auto").strip().lower()
    if choice not in BACKENDS:
        raise ValueError(f"backend={choice!r} (argument or NWOR_LAB_BACKEND): choose one of "
                         f"{', '.join(BACKENDS)}")
    return choice


def _try_load() -> Exception | None:
    """Load the extension once per process; remember the failure instead of retrying a build."""
    global _loaded, _load_error
    if not _loaded and _load_error is None:
        try:
            from nwor_lab.ops import _ext
            _ext.load()
            _loaded = True
        except Exception as err:  # noqa: BLE001 - any failure means "fall back", reported below
            _load_error = err
    return None if _loaded else _load_error


def backend(device=None, backend: str | None = None) -> BackendInfo:
    """Which implementation runs for tensors on `device` (default: CUDA if present, else CPU)."""
    choice = resolve(backend)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type != "cuda":
        return BackendInfo("torch", f"tensors on {device.type} always use the torch reference")
    if not torch.cuda.is_available():
        return BackendInfo("torch", "CUDA is not available in this process")
    if choice == "torch":
        return BackendInfo("torch", "backend 'torch' was requested (NWOR_LAB_BACKEND or config)")
    err = _try_load()
    if err is None:
        return BackendInfo("cuda", "the nwor_lab CUDA extension is built and loaded")
    if choice == "cuda":
        raise RuntimeError(f"backend 'cuda' was requested but the extension failed to build/load: {err}") from err
    return BackendInfo("torch", f"the CUDA extension failed to build/load ({type(err).__name__}: "
                                f"{str(err).splitlines()[0] if str(err) else ''}); using the torch reference")


def use_cuda(t: torch.Tensor, backend: str | None = None) -> bool:
    """True when an op on tensor `t` should call the CUDA extension."""
    global _warned
    if not t.is_cuda:
        return False
    if _loaded and backend in ("auto", "cuda"):  # hot path: explicit choice, extension loaded
        return True
    info = globals()["backend"](t.device, backend)
    if info.name == "torch" and resolve(backend) == "auto" and not _warned:
        _warned = True
        warnings.warn(f"nwor_lab: {info.reason}", RuntimeWarning, stacklevel=3)
    return info.name == "cuda"
