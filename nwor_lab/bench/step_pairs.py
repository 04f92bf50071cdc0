"""The graphed step's ratios as paired repeats: every (temperature, write policy) engine of a batch
replayed round-robin (`interleaved_times_us`, every other repeat in reverse order), so each ratio is
taken repeat by repeat between replays that ran next to each other, and stored as its median and
min–max (`bench.spread.paired`). What `bench step` gives as one ratio of two medians, here with its
spread: the two checks of the step that a single run cannot settle,

    T > 0 against greedy      t(T, mode) / t(0, mode)       (goal: <= 1.10 at every batch)
    a policy against off      t(T, cow) / t(T, off), t(T, stage) / t(T, off)

    python -m nwor_lab.bench.step_pairs --model 8b --batches 1,16,64 --temperatures 0,0.8 \\
        --modes off,cow,stage --reps 21 --out step_pairs_8b_h200.json          (CUDA only)

The engines are `bench.step.StepCase`'s (the engine's own step body, forced acceptance, each case's
decode bucket captured; `replay` restores the bucket's inputs before every replay, so every timed
call repeats the same step). GPU time per replay, CUDA events around `iters` replays.
"""
from __future__ import annotations

import itertools
import json
import sys
import time

import torch

from nwor_lab.bench.kernels import interleaved_times_us
from nwor_lab.bench.output import save_json
from nwor_lab.bench.spread import paired, spread
from nwor_lab.bench.step import StepCase, make_pair
from nwor_lab.bench.timing import ORDERS
from nwor_lab.commandline import args as types
from nwor_lab.commandline.errors import LabArgumentParser, UsageError
from nwor_lab.config import nwor_modes


def measure(pair, batch: int, k: int, context: int, rate: float, temperatures, modes, *, iters: int = 5,
            reps: int = 21, order: str = "abba") -> dict:
    """One batch: µs per replay of every (temperature, mode) case (median, min–max, every repeat) and
    the paired ratios: each temperature over the first (per mode), each mode over the first (per
    temperature)."""
    cases = {(t, m): StepCase(pair, batch, k, context, m, rate, temperature=t)
             for t, m in itertools.product(temperatures, modes)}
    missing = [key for key, c in cases.items() if c.inputs is None or c.inputs.graph is None]
    if missing:
        raise RuntimeError(f"step_pairs: no captured decode bucket for {missing} (needs CUDA graphs on a GPU)")
    times = interleaved_times_us({key: c.replay for key, c in cases.items()}, iters=iters, reps=reps, order=order)
    name = lambda t, m: f"T{t:g} {m}"                                         # noqa: E731
    row = {"batch": batch, "k": k, "context": context, "rate": rate, "iters": iters, "reps": reps, "order": order,
           "graph_us": {name(t, m): spread(v, 1) for (t, m), v in times.items()}}
    t0, m0 = temperatures[0], modes[0]
    row["over_T0"] = {name(t, m): paired(times[(t, m)], times[(t0, m)], 4)
                      for t, m in itertools.product(temperatures[1:], modes)}
    row["over_off"] = {name(t, m): paired(times[(t, m)], times[(t, m0)], 4)
                       for t, m in itertools.product(temperatures, modes[1:])}
    del cases
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = LabArgumentParser(prog="python -m nwor_lab.bench.step_pairs", description=__doc__.splitlines()[0])
    p.add_argument("--model", type=types.one_of(("shipped", "8b")), default="8b")
    p.add_argument("--batches", type=types.listed(types.integer(1, 4096), "batch sizes"), default=(1, 16, 64))
    p.add_argument("--k", type=types.integer(1, 64), default=4)
    p.add_argument("--rate", type=types.fraction, default=0.5, help="forced acceptance rate")
    p.add_argument("--context", type=types.integer(1, 1 << 20), default=1024, help="cached tokens per request")
    p.add_argument("--temperatures", type=types.listed(types.temperature, "temperatures"), default=(0.0, 0.8),
                   help="the first is the reference of `over_T0`")
    p.add_argument("--modes", type=types.listed(types.one_of(nwor_modes()), "write policies"),
                   default=tuple(nwor_modes()), help="the first is the reference of `over_off`")
    p.add_argument("--iters", type=types.integer(1, 1000), default=5, help="replays per timed repeat")
    p.add_argument("--reps", type=types.integer(3, 1000), default=21, help="repeats (each ratio paired per repeat)")
    p.add_argument("--order", type=types.one_of(ORDERS), default="abba",
                   help="the cases' order within a repeat: abba (reversed every other repeat) or shuffle (a seeded "
                        "permutation each repeat: no case keeps the same neighbours)")
    p.add_argument("--out", type=types.output_file, help="write the JSON here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise UsageError("step_pairs: needs a CUDA device (none is visible here); run it on a GPU machine")
    pair = make_pair(args.model)
    rows = []
    for batch in args.batches:
        with torch.no_grad():
            row = measure(pair, batch, args.k, args.context, args.rate, args.temperatures, args.modes,
                          iters=args.iters, reps=args.reps, order=args.order)
        rows.append(row)
        print(json.dumps({"batch": batch, "over_T0": {k: v["median"] for k, v in row["over_T0"].items()},
                          "over_off": {k: v["median"] for k, v in row["over_off"].items()}}), flush=True)
    result = {"what": __doc__.splitlines()[0], "model": args.model, "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "cuda": torch.version.cuda,
              "command": "python -m nwor_lab.bench.step_pairs " + " ".join(argv),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "results": rows}
    save_json(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
