"""Benchmark (not a test): the prefill-to-decode hand-off against one engine, per strategy and write
policy, on the CPU with the shipped tiny pair: time to the first token, time per output token,
bytes shipped, acceptance after the hand-off, and whether the tokens are one engine's.

    nwor-lab bench disagg                                   # in-process transport
    nwor-lab bench disagg --transport gloo --strategies nwor,no_head --out disagg_cpu.json

One engine: the prompts are queued and run to the end; its first step (the prefill, the first
token) is its TTFT, the rest divided by the tokens after the first its TPOT. Hand-off: the prefill
engine's step is the TTFT; the transfer (encode, send, receive, decode the frames) and the decode
engine's run make the TPOT. With `--transport gloo` both engines run in their own process (the
timings come from each rank; starting the processes is not counted). CPU timings on a shared
machine are noisy: read bytes and acceptance first. The GPU (8B shape, NCCL or CUDA IPC) is not
measured by this bench.
"""
from __future__ import annotations

import json
import platform
import sys
import time

from nwor_lab.bench.output import save_json
from nwor_lab.commandline import args as types
from nwor_lab.commandline.errors import LabArgumentParser
from nwor_lab.config import LabConfig, nwor_modes

PROMPTS = ["Once upon a time, there was a little girl named Lily. She", "The cat sat on the mat and",
           "Tom and his dog went to the park. They", "One day, a big bird"]


def one_engine(make, prompts, new: int) -> dict:
    from nwor_lab.engine.generate import acceptance_stats
    e = make()
    reqs = [e.add_request(p, new) for p in prompts]
    t0 = time.perf_counter()
    e.step_with_progress()
    t1 = time.perf_counter()
    e.run()
    t2 = time.perf_counter()
    after_first = sum(len(r.output) - 1 for r in reqs)
    return {"tokens": [r.output for r in reqs], "ttft_s": t1 - t0, "tpot_s": (t2 - t1) / max(after_first, 1),
            "mean_acceptance_length": acceptance_stats(e.trace, e.k)[0]}


def main(argv=None) -> dict:
    from nwor_lab.disagg import HANDOFF_STRATEGIES, EnginePair, handoff, handoff_strategy, run_handoff
    from nwor_lab.disagg.transport import TRANSPORTS
    p = LabArgumentParser(prog="nwor-lab bench disagg", description=__doc__.split("\n\n")[0])
    p.add_argument("--strategies", type=types.listed(types.one_of(tuple(HANDOFF_STRATEGIES)), "strategies"),
                   default=("nwor", "write_all", "no_head"), help="hand-off strategies, comma-separated")
    p.add_argument("--nwor", type=types.listed(types.one_of(nwor_modes()), "write policies"), default=("off", "stage"))
    p.add_argument("--transport", choices=[t for t in TRANSPORTS if t != "nccl"], default="inprocess",
                   help="inprocess, or gloo (two processes); nccl is not run by this bench")
    p.add_argument("--k", type=types.integer(1, 16), default=4)
    p.add_argument("--max-new-tokens", type=types.integer(2, 512), default=32)
    p.add_argument("--temperature", type=types.temperature, default=0.0, help="0: greedy; > 0: seeded sampling")
    p.add_argument("--out", type=types.output_file, default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    from nwor_lab.model.shipped import load_tiny
    target, head, tok = load_tiny()
    prompts = [tok.encode(t).ids for t in PROMPTS]
    rows = []
    for mode in args.nwor:
        kw = (("k", args.k), ("num_blocks", 128), ("block_size", 16), ("temperature", args.temperature))
        pair = EnginePair("tiny", 0, LabConfig(nwor_mode=mode), kw)

        def make():
            from nwor_lab.engine import SpecEngine
            return SpecEngine(target, head, pair.config, **dict(kw))
        ref = one_engine(make, prompts, args.max_new_tokens)
        rows.append({"nwor": mode, "strategy": "one engine", "ttft_s": ref["ttft_s"], "tpot_s": ref["tpot_s"],
                     "mean_acceptance_length": ref["mean_acceptance_length"], "kv_bytes": 0, "frame_bytes": 0})
        print(json.dumps(rows[-1]), flush=True)
        for name in args.strategies:
            s = handoff_strategy(name)
            if args.transport == "inprocess":
                res = handoff(make(), make(), prompts, args.max_new_tokens, name)
            else:
                res = run_handoff(pair, prompts, args.max_new_tokens, name, transport=args.transport)
            after_first = sum(len(t) - 1 for t in res.token_ids)
            row = {"nwor": mode, **res.summary(), "ttft_s": res.prefill_s,
                   "tpot_s": (res.transfer_s + res.decode_s) / max(after_first, 1),
                   "tokens_equal_one_engine": res.token_ids == ref["tokens"],
                   "declared_exact": s.exact_sampled if args.temperature else s.exact_greedy,
                   "junk_rows": sum(res.junk_rows)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = {"command": "nwor-lab bench disagg " + " ".join(argv if argv is not None else sys.argv[1:]),
           "model": "tiny (shipped pair)", "device": "cpu", "machine": platform.node(),
           "transport": args.transport, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
           "k": args.k, "temperature": args.temperature, "rows": rows}
    save_json(out, args.out, indent=2)
    return out
