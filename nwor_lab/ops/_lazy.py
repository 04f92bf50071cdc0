"""A module imported on first use, once per process (the Triton kernels: the package never
needs triton at import)."""
from __future__ import annotations

import importlib


class LazyModule:
    """`get()` -> the module, or None when it could not be imported; `error` says why (kept: one
    import attempt per process, ImportError or triton failing to initialise its backend)."""

    def __init__(self, name: str):
        self.name = name
        self.module = None
        self.error: Exception | None = None

    def get(self):
        if self.module is None and self.error is None:
            try:
                self.module = importlib.import_module(self.name)
            except Exception as err:   # noqa: BLE001 - the reason is kept and reported by the caller
                self.error = err
        return self.module
