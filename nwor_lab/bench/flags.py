"""The flags the engine benches share, spelled once (names, choices, defaults and help alike)."""
from __future__ import annotations

import sys

from nwor_lab.commandline import args as types
from nwor_lab.config import ATTENTION_BACKENDS, SCV_MODES


def parsed(parser, argv=None) -> tuple[list[str], object]:
    """(the command line's words: `argv`, or sys.argv's after the program; `parser`'s namespace of them)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return argv, parser.parse_args(argv)


def add_engine_flags(p, *, scv: bool = True) -> None:
    """--attention (the verify window's backend), --scv (one mode; `scv=False` leaves it to the bench),
    --no-cuda-graph (every step eager) and --out (also write the JSON here) on the argparse parser `p`."""
    p.add_argument("--attention", type=types.one_of(ATTENTION_BACKENDS), default="auto")
    if scv:
        p.add_argument("--scv", type=types.one_of(SCV_MODES), default="graph",
                       help="SCV mode (off: the host loop, so every step runs eagerly)")
    p.add_argument("--no-cuda-graph", action="store_true", help="every step eager")
    p.add_argument("--out", type=types.output_file, default=None, help="also write the JSON here")
