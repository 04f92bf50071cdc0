"""Facts about where a sweep runs (recorded in every row) and which GPU each worker gets.

torch is imported here lazily, once per sweep, and only where an NVIDIA driver exists (to count
and name the GPUs): `import nwor_lab.sweep` stays torch-free so a notebook can record metrics,
and a CPU sweep starts, without paying seconds for it.
"""
from __future__ import annotations

import glob
import importlib.util
import os
import platform
import re
import socket
import sys
from pathlib import Path
from typing import Any


def _no_cuda_driver() -> bool:
    """True where CUDA surely cannot run: Linux without NVIDIA (or WSL GPU) device nodes."""
    return sys.platform.startswith("linux") and not glob.glob("/dev/nvidia*") and not os.path.exists("/dev/dxg")


def _installed_torch_version() -> str | None:
    """torch's `__version__` without importing torch: its generated `version.py` holds it with
    the build tag (`2.14.1+cu130`), which the package metadata drops; None if not found."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        text = Path(spec.submodule_search_locations[0], "version.py").read_text(encoding="utf-8")
    except OSError:
        return None
    match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return match.group(1) if match else None


def _torch_facts() -> tuple[str | None, list[str]]:
    """(torch version, names of the CUDA devices this process sees); (None, []) without torch.

    Importing torch costs seconds; on a machine without an NVIDIA driver the installed
    version (package metadata) is all there is to learn, so torch is not imported there.
    """
    version = _installed_torch_version()
    if version is not None and _no_cuda_driver():
        return version, []
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
