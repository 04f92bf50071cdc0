"""`sweep` and `report` subcommands: `add_parsers(subparsers)` for `nwor-lab`, `main(argv)` for
`python -m nwor_lab.sweep`.

    nwor-lab sweep NOTEBOOK --grid name=v1,v2 [--grid other=a,b] --out runs/NAME
                   [--workers N] [--timeout S] [--set name=value ...] [--kernel NAME]
    nwor-lab report runs/NAME [--out FILE]

Exit codes: 0 every run ok; 1 some run failed (ids and errors printed); 2 bad input, a full or
read-only disk (one line on stderr; bad input: nothing run); 130 interrupted by Ctrl-C (143 by
SIGTERM), finished runs kept. Every flag is checked before anything runs (`nwor_lab.commandline.args`),
and errors take the `nwor-lab` command's one error path (`nwor_lab.commandline.errors.run`).
"""
from __future__ import annotations

import shlex
import sys

from nwor_lab.commandline import args as types
from nwor_lab.commandline.errors import LabArgumentParser, interrupted_exit_code, run
from nwor_lab.sweep.grid import parse_grid, parse_set


def _resume_command(args) -> str:
    parts = [args.notebook]
    for spec in args.grid:
        parts += ["--grid", spec]
    for spec in args.set:
        parts += ["--set", spec]
    parts += ["--out", str(args.out), "--workers", str(args.workers)]
    if args.timeout is not None:
        parts += ["--timeout", f"{args.timeout:g}"]
    if args.kernel:
        parts += ["--kernel", args.kernel]
    return f"{args.prog_name} {shlex.join(parts)}"  # the prog is a command prefix, not one word


def cmd_sweep(args) -> int:
    """Raises SweepInputError (a ValueError: one line, exit 2) for bad input, before any run."""
    from nwor_lab.sweep.runner import run_sweep

    grid = parse_grid(args.grid)
    fixed = parse_set(args.set, grid)
    try:
        outcome = run_sweep(args.notebook, grid, args.out, fixed=fixed, workers=args.workers,
                            timeout=args.timeout, kernel_name=args.kernel, progress=not args.no_progress,
                            resume_hint=_resume_command(args))
    except KeyboardInterrupt as stop:  # before the runs started (the runner handles signals during them)
        print(f"{args.prog_name}: interrupted before any run started; nothing recorded", file=sys.stderr)
        return interrupted_exit_code(stop)
    return outcome.exit_code


def cmd_report(args) -> int:
    from nwor_lab.sweep.report import write_report

    path = write_report(args.run_dir, args.out)
    print(f"wrote {path}")
    return 0


def add_parsers(subparsers) -> None:
    """Add `sweep` and `report` to an argparse subparsers object; `args.func(args)` -> exit code."""
    s = subparsers.add_parser(
        "sweep", help="run a notebook over a parameter grid with papermill (rows in OUT/results.jsonl)",
        description="Run NOTEBOOK once per combination of the --grid values. Values are typed like Python "
                    "literals: 8 int, 0.5 float, true/false, none; quote to force a string. Re-running skips "
                    "runs already ok and retries failed ones.",
        epilog="exit codes: 0 every run ok, 1 some run failed, 2 bad input (nothing run), 130 interrupted "
               "(finished runs kept; the same command resumes)")
    s.add_argument("notebook", metavar="NOTEBOOK", help="notebook with a cell tagged 'parameters'")
    s.add_argument("--grid", action="append", default=[], metavar="NAME=V1,V2",
                   help="a swept parameter and its values (repeat for more; every combination runs)")
    s.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a parameter fixed for every run")
    s.add_argument("--out", required=True, metavar="DIR", type=types.output_folder,
                   help="folder for results.jsonl, notebooks/ and logs/, e.g. runs/NAME (one notebook's runs)")
    s.add_argument("--workers", type=types.integer(1, 256), default=1, metavar="N",
                   help="runs at once (each pinned to one GPU via CUDA_VISIBLE_DEVICES when several exist)")
    s.add_argument("--timeout", type=types.seconds, default=None, metavar="S",
                   help="seconds per run (wall clock, kernel start included) before it is killed and recorded as failed")
    s.add_argument("--kernel", default=None, metavar="NAME", help="Jupyter kernel (default: the notebook's own)")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")
    s.set_defaults(func=cmd_sweep, prog_name=s.prog)
    r = subparsers.add_parser("report", help="one self-contained HTML page of a sweep's runs and metrics",
                              description="Table of every run and one figure per numeric metric, plotly inline.")
    r.add_argument("run_dir", metavar="RUN_DIR", help="the sweep's --out folder (holds results.jsonl)")
    r.add_argument("--out", type=types.output_file, default=None, metavar="FILE",
                   help="HTML file (default RUN_DIR/report.html; replaced atomically)")
    r.set_defaults(func=cmd_report, prog_name=r.prog)


def main(argv: list[str] | None = None) -> int:
    parser = LabArgumentParser(prog="python -m nwor_lab.sweep",
                               description="Papermill sweeps of the lab's notebooks, and their HTML report.")
    add_parsers(parser.add_subparsers(dest="cmd", required=True, parser_class=LabArgumentParser))

    def dispatch(argv):
        args = parser.parse_args(argv)
        return args.func(args)
    return run(dispatch, sys.argv[1:] if argv is None else argv)
