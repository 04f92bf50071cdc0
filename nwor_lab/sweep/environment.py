"""Facts about where a sweep runs (recorded in every row) and which GPU each worker gets.

torch is imported here lazily, once per sweep: `import nwor_lab.sweep` stays torch-free so a
notebook can record metrics, and the sweep command can start, without paying for it.
"""
from __future__ import annotations

import os
import platform
import socket
from typing import Any


def _torch_facts() -> tuple[str | None, list[str]]:
    """(torch version, names of the CUDA devices this process sees); (None, []) without torch."""
    try:
        import torch
    except ImportError:
        return None, []
    names = []
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return torch.__version__, names


def visible_devices(env: dict[str, str] | None = None, count: int = 0) -> list[str]:
    """The device ids a run may be pinned to: the parent's `CUDA_VISIBLE_DEVICES` if set
    (ids or UUIDs, kept as given), else `0 .. count-1`."""
    env = os.environ if env is None else env
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip()]
    return [str(i) for i in range(count)]


def device_for_slot(slot: int, devices: list[str]) -> str | None:
    """Worker slot -> the one device it sees, round-robin; None (leave the env alone) unless
    several GPUs exist — one GPU is shared by all workers, no GPU means CPU concurrency."""
    if len(devices) < 2:
        return None
    return devices[slot % len(devices)]


class Environment:
    """Host facts computed once; `row_facts(slot)` adds the device a worker's run sees."""

    def __init__(self) -> None:
        self.torch_version, self.gpu_names = _torch_facts()
        self.devices = visible_devices(count=len(self.gpu_names))
        self.base = {
            "python": platform.python_version(),
            "torch": self.torch_version,
            "host": socket.gethostname(),
            "platform": platform.platform(terse=True),
        }

    def device_env(self, slot: int) -> dict[str, str]:
        """Extra environment variables for a run in worker `slot`."""
        device = device_for_slot(slot, self.devices)
        return {} if device is None else {"CUDA_VISIBLE_DEVICES": device}

    def row_facts(self, slot: int) -> dict[str, Any]:
        """`env` of a row: host facts and the device the run sees as its `cuda:0` (or `cpu`)."""
        device = device_for_slot(slot, self.devices)
        index = 0 if device is None else slot % len(self.devices)
        if not self.gpu_names:
            described = "cpu"
        else:
            name = self.gpu_names[index] if index < len(self.gpu_names) else "unknown GPU"
            described = f"cuda:0 ({name})"
        return {**self.base, "device": described, "cuda_visible_devices": device}
