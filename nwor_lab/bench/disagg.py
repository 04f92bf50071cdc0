"""Benchmark (not a test): the prefill-to-decode hand-off against one engine, per strategy and write
policy, on the CPU with the shipped tiny pair: time to the first token, time per output token,
bytes shipped, acceptance after the hand-off, and whether the tokens are one engine's.

    nwor-lab bench disagg                                   # in-process transport
    nwor-lab bench disagg --transport gloo --strategies nwor,no_head --out disagg_cpu.json
    nwor-lab bench disagg --model 8b --transport cuda_ipc --out benchmarks/results/disagg_8b_h200.json
                                                            # one GPU: both engines share it (CUDA IPC)

One engine: the prompts are queued and run to the end; its first step (the prefill, the first
token) is its TTFT, the rest divided by the tokens after the first its TPOT. Hand-off: the prefill
engine's step is the TTFT; the transfer (encode, send, receive, decode the frames) and the decode
engine's run make the TPOT. With `--transport gloo` both engines run in their own process (the
timings come from each rank; starting the processes is not counted). CPU timings on a shared
machine are noisy: read bytes and acceptance first. `--model 8b` (random bf16 weights, forced
acceptance, random prompts) runs on one GPU with `--transport cuda_ipc` (both engines on the same
card, the K/V rows handed over as CUDA IPC handles: nwor_lab.disagg.ipc) or `inprocess`; `8b-mini`
is the same path at toy size. NCCL (an engine per GPU) is not run by this bench.
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


def one_engine(make, prompts, new: int, device=None) -> dict:
    import torch

    from nwor_lab.engine.generate import acceptance_stats
    sync = torch.cuda.synchronize if device is not None and device.type == "cuda" else (lambda: None)
    e = make()
    reqs = [e.add_request(p, new) for p in prompts]
    sync()
    t0 = time.perf_counter()
    e.step_with_progress()
    sync()
    t1 = time.perf_counter()
    e.run()
    sync()
    t2 = time.perf_counter()
    after_first = sum(len(r.output) - 1 for r in reqs)
    return {"tokens": [r.output for r in reqs], "ttft_s": t1 - t0, "tpot_s": (t2 - t1) / max(after_first, 1),
            "mean_acceptance_length": acceptance_stats(e.trace, e.k)[0]}


def workload(args, device):
    """-> (EnginePair factory by write policy, prompts, the model's words for the JSON)."""
    import torch

    from nwor_lab.disagg import EnginePair
    if args.model == "tiny":
        from nwor_lab.model.shipped import load_tiny
        _, _, tok = load_tiny()
        prompts = [tok.encode(t).ids for t in PROMPTS]
        kw = (("k", args.k), ("num_blocks", 128), ("block_size", 16), ("temperature", args.temperature))
        return (lambda mode: EnginePair("tiny", 0, LabConfig(nwor_mode=mode), kw)), prompts, "tiny (shipped pair)"
    # random weights (8b on CUDA, 8b-mini its toy-size twin): random prompts, forced acceptance
    from nwor_lab.model.shapes import SHAPES
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, SHAPES[args.model]["vocab_size"], (args.prompt_len,), generator=g).tolist()
               for _ in range(args.prompts)]
    bs = 16
    per = -(-(args.prompt_len + args.max_new_tokens + args.k + 1) // bs)
    kw = (("k", args.k), ("num_blocks", args.prompts * per + 1), ("block_size", bs), ("temperature", args.temperature),
          ("max_num_seqs", args.prompts), ("max_num_batched_tokens", max(1024, args.prompts * args.prompt_len)))
    words = f"{args.model} shape, random weights, {args.head} head, forced acceptance {args.acceptance!r}"
    return (lambda mode: EnginePair(args.model, 0, LabConfig(nwor_mode=mode, cuda_graph=False), kw, args.head,
                                    args.acceptance)), prompts, words


def main(argv=None) -> dict:
    import torch

    from nwor_lab.bench.engine8b import acceptance_text
    from nwor_lab.bench.timing import bench_device
    from nwor_lab.disagg import HANDOFF_STRATEGIES, handoff, handoff_strategy, run_handoff
    from nwor_lab.disagg.transport import TRANSPORTS
    p = LabArgumentParser(prog="nwor-lab bench disagg", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=types.one_of(("tiny", "8b", "8b-mini")), default="tiny",
                   help="tiny: the shipped pair (CPU); 8b: the Llama-3-8B shape, random bf16 weights (CUDA); "
                        "8b-mini: the same path at toy size")
    p.add_argument("--device", type=types.device, default=None, help="default: cpu for tiny and 8b-mini, cuda for 8b")
    p.add_argument("--head", type=types.one_of(("eagle1", "eagle3")), default="eagle3", help="8B shapes: the head")
    p.add_argument("--acceptance", type=acceptance_text, default="shipped",
                   help="8B shapes: the forced acceptance profile (random weights accept nothing on their own)")
    p.add_argument("--prompts", type=types.integer(1, 256), default=8, help="8B shapes: prompts handed off at once")
    p.add_argument("--prompt-len", type=types.integer(1, 8192), default=512, help="8B shapes: tokens per prompt")
    p.add_argument("--strategies", type=types.listed(types.one_of(tuple(HANDOFF_STRATEGIES)), "strategies"),
                   default=("nwor", "write_all", "no_head"), help="hand-off strategies, comma-separated")
    p.add_argument("--nwor", type=types.listed(types.one_of(nwor_modes()), "write policies"), default=("off", "stage"))
    p.add_argument("--transport", choices=[t for t in TRANSPORTS if t != "nccl"], default="inprocess",
                   help="inprocess; gloo (two processes, CPU); cuda_ipc (two processes sharing one GPU); "
                        "nccl is not run by this bench")
    p.add_argument("--k", type=types.integer(1, 16), default=4)
    p.add_argument("--max-new-tokens", type=types.integer(2, 512), default=32)
    p.add_argument("--temperature", type=types.temperature, default=0.0, help="0: greedy; > 0: seeded sampling")
    p.add_argument("--out", type=types.output_file, default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    device = bench_device("disagg", args.device, args.model, default_cuda=args.model == "8b")
    if args.transport == "cuda_ipc" and device.type != "cuda":
        p.error("--transport cuda_ipc: two processes share one GPU's memory; give a CUDA --device "
                "(or --transport gloo on the CPU)")
    if args.transport == "gloo" and device.type != "cpu":
        p.error("--transport gloo runs both engines on the CPU here; on one GPU use --transport cuda_ipc")
    make_pair, prompts, words = workload(args, device)
    rows = []
    for mode in args.nwor:
        pair = make_pair(mode)
        ref = one_engine(lambda: pair.build(device), prompts, args.max_new_tokens, device)
        if device.type == "cuda":
            torch.cuda.empty_cache()        # the reference engine's memory back before two more engines
        rows.append({"nwor": mode, "strategy": "one engine", "ttft_s": ref["ttft_s"], "tpot_s": ref["tpot_s"],
                     "mean_acceptance_length": ref["mean_acceptance_length"], "kv_bytes": 0, "frame_bytes": 0})
        print(json.dumps(rows[-1]), flush=True)
        for name in args.strategies:
            s = handoff_strategy(name)
            if args.transport == "inprocess":
                res = handoff(pair.build(device), pair.build(device), prompts, args.max_new_tokens, name)
            else:
                res = run_handoff(pair, prompts, args.max_new_tokens, name, transport=args.transport)
            after_first = sum(len(t) - 1 for t in res.token_ids)
            row = {"nwor": mode, **res.summary(), "ttft_s": res.prefill_s,
                   "tpot_s": (res.transfer_s + res.decode_s) / max(after_first, 1),
                   "tokens_equal_one_engine": res.token_ids == ref["tokens"],
                   "declared_exact": s.exact_sampled if args.temperature else s.exact_greedy,
                   "junk_rows": sum(res.junk_rows), **{k: v for k, v in res.extra.items() if k.endswith("bytes")}}
            rows.append(row)
            print(json.dumps(row), flush=True)
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    out = {"command": "nwor-lab bench disagg " + " ".join(argv if argv is not None else sys.argv[1:]),
           "model": words, "device": card, "machine": platform.node(),
           "transport": args.transport, "prompts": len(prompts), "prompt_tokens": sum(len(x) for x in prompts),
           "max_new_tokens": args.max_new_tokens, "k": args.k, "temperature": args.temperature, "rows": rows}
    save_json(out, args.out, indent=2)
    return out


if __name__ == "__main__":
    main()
