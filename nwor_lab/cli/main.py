"""The `nwor-lab` command: doctor, selfcheck, build, bench, generate, audit (and the workshop commands).

Every command goes through one error path (`nwor_lab.commandline.errors`): a bad argument, file or
environment value prints one line `nwor-lab: error: ...` and exits 2; `--traceback` (anywhere) or
NWOR_LAB_DEBUG=1 shows the stack. Nothing here imports torch before a command needs it, so
`--help` and argument errors are instant and work whatever the environment holds.
"""
from __future__ import annotations

import argparse
import json
import sys

from nwor_lab.cli import audit, doctor, generate
from nwor_lab.commandline import args as types
from nwor_lab.commandline.environment import check_backend_arg, check_device_arg, lab_config
from nwor_lab.commandline.errors import PROG, LabArgumentParser, UsageError, _debug_env, run
from nwor_lab.config import BACKENDS, CACHE_DTYPE_NAMES, KV_LAYOUTS, SCV_MODES

BENCHMARKS = ("kernels", "policies", "engine", "step", "attention", "tp", "ring", "serve", "tree",
              "state", "disagg", "prefix")   # nwor_lab/bench/<name>.py, each with its own parser


# -- selfcheck -------------------------------------------------------------------------------------
def _add_selfcheck(sub) -> None:
    s = sub.add_parser("selfcheck", help="one random mixed batch through every mode, invariants checked (JSON)")
    s.add_argument("--device", type=types.device, default=None, help="cpu, cuda or cuda:N (default: cuda if present)")
    s.add_argument("--seed", type=types.seed, default=0)
    s.add_argument("--scv", choices=SCV_MODES, default="off")
    s.add_argument("--backend", choices=BACKENDS, default=None)
    s.add_argument("--cache-dtype", choices=CACHE_DTYPE_NAMES, default="auto")
    s.add_argument("--layout", choices=KV_LAYOUTS, default="HND")
    s.add_argument("--out", type=types.output_file, default=None,
                   help="also write the JSON here (checked before the work starts; replaced atomically)")
    s.set_defaults(func=_selfcheck)


def _selfcheck(args) -> int:
    from nwor_lab import atomic
    out = args.out
    cfg = lab_config(scv_mode=args.scv, backend=args.backend or "auto")
    import torch

    device = check_device_arg("--device", args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    check_backend_arg(cfg, device)
    from nwor_lab.selfcheck import selfcheck
    result = selfcheck(cfg, device=device, seed=args.seed, cache_dtype=args.cache_dtype, layout=args.layout)
    text = json.dumps(result, indent=2)
    print(text, flush=True)              # first: a full disk must not lose the result
    if out is not None:
        atomic.write_text(out, text + "\n")
    if not result["ok"]:
        first = result["violations"][0] if result.get("violations") else None
        what = first["message"] if first else "see the JSON above"
        print(f"{PROG}: selfcheck failed: {what}", file=sys.stderr)
        return 1
    return 0


# -- build -----------------------------------------------------------------------------------------
def _add_build(sub) -> None:
    b = sub.add_parser("build", help="JIT-build the CUDA extension now (normally built on first use)")
    b.add_argument("--verbose", action="store_true")
    b.set_defaults(func=_build)


def _build(args) -> int:
    nvcc, looked = doctor.find_nvcc()
    if nvcc is None:
        raise UsageError(f"nvcc not found (looked in {looked}): the CUDA extension needs the CUDA toolkit; "
                         f"install it or set CUDA_HOME to its folder (`{PROG} doctor` shows what was found)")
    from nwor_lab.ops import _ext
    _ext.load(verbose=args.verbose or None)
    print(json.dumps(_ext.build_info(), indent=2, default=str))
    return 0


# -- bench -----------------------------------------------------------------------------------------
def _add_bench(sub) -> None:
    be = sub.add_parser("bench", help="benchmarks: `kernels`, `policies`, `engine`, `step`, `attention`, `tp`, `ring`, `serve`, `tree` or `state` (each has its own --help)")
    be.add_argument("what", choices=BENCHMARKS)


def _bench(what: str, rest) -> int:
    import importlib

    result = importlib.import_module(f"nwor_lab.bench.{what}").main(rest)
    return result if isinstance(result, int) else 0  # the benchmarks return their JSON dict


# -- the dispatcher --------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The top-level parser. A command family adds itself with `add_parsers(subparsers)`, each
    parser with `set_defaults(func=run)` (see nwor_lab.commandline.errors)."""
    from nwor_lab.sweep.cli import add_parsers as sweep_parsers
    from nwor_lab.workshop import add_parsers as workshop_parsers
    p = LabArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--traceback", action="store_true",
                   help="on an error, show the Python stack too (also NWOR_LAB_DEBUG=1); allowed anywhere")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=LabArgumentParser)
    for add in (doctor.add_parsers, _add_selfcheck, _add_build, _add_bench, generate.add_parsers,
                audit.add_parsers, sweep_parsers, workshop_parsers):
        add(sub)
    return p


def _debug_logging() -> None:
    """NWOR_LAB_DEBUG=1: show the lab's window lifecycle log (begin, accepted, commit/restore)."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    lab = logging.getLogger("nwor_lab")
    lab.setLevel(logging.INFO)
    lab.addHandler(handler)


def _dispatch(argv: list[str]) -> int:
    if argv[:1] == ["generate"]:  # its own parser (nwor_lab.cli.generate), --help included
        return generate.cli_generate(argv[1:])
    if argv[:1] == ["bench"] and argv[1:2] and argv[1] in BENCHMARKS:  # their own parsers too
        return _bench(argv[1], argv[2:])
    args = build_parser().parse_args(argv)
    return args.func(args)


def main(argv=None) -> int:
    """Run one command; always returns the exit code (0 ok, 1 failed check or bug, 2 bad input,
    130 interrupted). The error path is `nwor_lab.commandline.errors.run`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if _debug_env():
        _debug_logging()
    return run(_dispatch, argv)


if __name__ == "__main__":
    sys.exit(main())
