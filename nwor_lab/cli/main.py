"""The `nwor-lab` command: doctor, selfcheck, build, bench, generate (and the workshop commands)."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

from nwor_lab.config import BACKENDS, SCV_MODES
from nwor_lab.kv.cache import CACHE_DTYPES
from nwor_lab.kv.layout import KVLayout


def _doctor(args) -> int:
    import platform

    import torch

    import nwor_lab
    from nwor_lab.ops.backend import backend
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    nvcc_version = None
    if nvcc:
        try:
            out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
            nvcc_version = out.strip().splitlines()[-1] if out.strip() else None
        except (OSError, subprocess.SubprocessError) as err:
            nvcc_version = f"failed: {err}"
    info = backend(None, args.backend)
    report = {
        "nwor_lab": nwor_lab.__version__, "python": platform.python_version(), "torch": torch.__version__,
        "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "nvcc": nvcc, "nvcc_version": nvcc_version, "CUDA_HOME": os.environ.get("CUDA_HOME"),
        "backend": info.name, "backend_reason": info.reason,
    }
    print(json.dumps(report, indent=2))
    return 0


def _selfcheck(args) -> int:
    from nwor_lab.config import LabConfig
    from nwor_lab.selfcheck import selfcheck
    cfg = LabConfig.from_env(LabConfig(scv_mode=args.scv, backend=args.backend or "auto"))
    result = selfcheck(cfg, device=args.device, seed=args.seed, cache_dtype=args.cache_dtype, layout=args.layout)
    text = json.dumps(result, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0 if result["ok"] else 1


def _build(args) -> int:
    from nwor_lab.ops import _ext
    _ext.load(verbose=args.verbose or None)
    print(json.dumps(_ext.build_info(), indent=2, default=str))
    return 0


BENCHMARKS = ("kernels", "policies", "engine")   # nwor_lab/bench/<name>.py, each with its own parser


def _bench(what: str, rest) -> int:
    import importlib

    result = importlib.import_module(f"nwor_lab.bench.{what}").main(rest)
    return result if isinstance(result, int) else 0  # the benchmarks return their JSON dict


def _debug_logging() -> None:
    """NWOR_LAB_DEBUG=1: show the lab's window lifecycle log (begin, accepted, commit/restore)."""
    import logging

    from nwor_lab.config import LabConfig
    if LabConfig.from_env().debug:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
        lab = logging.getLogger("nwor_lab")
        lab.setLevel(logging.INFO)
        lab.addHandler(handler)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _debug_logging()
    if argv[:1] == ["generate"]:  # its own parser (nwor_lab.cli.generate), --help included
        from nwor_lab.cli.generate import cli_generate
        return cli_generate(argv[1:]) or 0
    if argv[:1] == ["bench"] and argv[1:2] and argv[1] in BENCHMARKS:  # their own parsers too
        return _bench(argv[1], argv[2:])
    p = argparse.ArgumentParser(prog="nwor-lab", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("doctor", help="python, torch, CUDA, nvcc, and which backend runs and why")
    d.add_argument("--backend", choices=BACKENDS, default=None)
    s = sub.add_parser("selfcheck", help="one random mixed batch through every mode, invariants checked (JSON)")
    s.add_argument("--device", default=None)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--scv", choices=SCV_MODES, default="off")
    s.add_argument("--backend", choices=BACKENDS, default=None)
    s.add_argument("--cache-dtype", choices=list(CACHE_DTYPES), default="auto")
    s.add_argument("--layout", choices=[layout.name for layout in KVLayout], default="HND")
    s.add_argument("--out", default=None, help="also write the JSON here")
    b = sub.add_parser("build", help="JIT-build the CUDA extension now (normally built on first use)")
    b.add_argument("--verbose", action="store_true")
    be = sub.add_parser("bench", help="benchmarks: `kernels`, `policies` or `engine` (each has its own --help)")
    be.add_argument("what", choices=BENCHMARKS)
    g = sub.add_parser("generate", help='speculative decoding with the shipped model: generate "PROMPT" --k 4 --nwor stage')
    g.add_argument("rest", nargs=argparse.REMAINDER)
    args, rest = p.parse_known_args(argv)
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    return {"doctor": _doctor, "selfcheck": _selfcheck, "build": _build}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
