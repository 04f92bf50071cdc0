"""The sampler's softmax at a temperature: torch's (`temperature_softmax_reference`) against the chunked
Triton kernels (`nwor_lab.ops.softmax`) at the 8B step's shapes, µs per call as paired repeats.

    python -m nwor_lab.bench.softmax --rows 64,256 --vocab 128256 --reps 21 --out softmax_h200.json   (CUDA only)

Rows: 64 is the bonus rows (and each head pass) at batch 64, 256 its verified rows at k 4. The logits
are bf16 (the model's dtype); each path is `iters` calls in one CUDA graph (as the step replays it),
the two graphs replayed back to back in each repeat (ABBA), and
`max_rel` says how far the kernels' probabilities are from torch's (where torch's exceed 1e-20).
"""
from __future__ import annotations

import json
import sys

import torch

from nwor_lab.bench.kernels import interleaved_times_us
from nwor_lab.bench.output import save_json
from nwor_lab.bench.spread import paired, spread
from nwor_lab.commandline import args as types
from nwor_lab.commandline.errors import LabArgumentParser, UsageError
from nwor_lab.ops.graphs import capture_graph
from nwor_lab.ops.softmax import temperature_softmax, temperature_softmax_reference


def measure(rows: int, vocab: int, temperature: float, reps: int, iters: int = 10) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(rows)
    x = (4 * torch.randn(rows, vocab, device="cuda", generator=gen)).to(torch.bfloat16)
    t = torch.full((rows,), temperature, device="cuda")
    got, want = temperature_softmax(x, t), temperature_softmax_reference(x, t)
    big = want > 1e-20
    # each path as `iters` calls captured in one CUDA graph (as a step replays them: no launch cost on
    # the host, which for two Triton launches eagerly exceeds the kernels' own time)
    graphs = {name: capture_graph(lambda fn=fn: [fn(x, t) for _ in range(iters)])
              for name, fn in (("torch", temperature_softmax_reference), ("kernels", temperature_softmax))}
    times = interleaved_times_us({name: g.replay for name, g in graphs.items()}, iters=1, reps=reps, abba=True)
    times = {name: [us / iters for us in v] for name, v in times.items()}
    return {"rows": rows, "vocab": vocab, "temperature": temperature,
            "us": {name: spread(v, 2) for name, v in times.items()},
            "kernels_over_torch": paired(times["kernels"], times["torch"], 4),
            "max_rel": float(((got - want).abs()[big] / want[big]).max()),
            "max_abs": float((got - want).abs().max())}


def main(argv=None) -> int:
    p = LabArgumentParser(prog="python -m nwor_lab.bench.softmax", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=types.listed(types.integer(1, 65536), "row counts"), default=(64, 256),
                   help="rows per call (default 64,256)")
    p.add_argument("--vocab", type=types.integer(1), default=128256, help="vocabulary (default 128256, the 8B shape's)")
    p.add_argument("--temperature", type=types.number_in(1e-3, 100.0), default=0.8, help="(default 0.8)")
    p.add_argument("--reps", type=types.integer(3), default=21, help="paired repeats (default 21)")
    p.add_argument("--out", type=types.output_file, help="write the JSON here too")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise UsageError("bench softmax times CUDA kernels: no CUDA device here")
    res = {"what": __doc__.split("\n\n")[0], "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "command": "python -m nwor_lab.bench.softmax " + " ".join(sys.argv[1:] if argv is None else argv),
           "results": [measure(r, a.vocab, a.temperature, a.reps) for r in a.rows]}
    print(json.dumps({r["rows"]: r["kernels_over_torch"]["median"] for r in res["results"]}))
    if a.out:
        save_json(res, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
