"""Benchmark (not a test): the prefill-to-decode hand-off against one engine, per strategy and write
policy, on the CPU with the shipped tiny pair: time to the first token, time per output token,
bytes shipped, acceptance after the hand-off, and whether the tokens are one engine's.

    nwor-lab bench disagg                                   # in-process transport
    nwor-lab bench disagg --transport gloo --strategies nwor,no_head --out disagg_cpu.json
    nwor-lab bench disagg --model 8b --transport cuda_ipc --out benchmarks/results/disagg_8b_h200.json
                                                            # one GPU: both engines share it (CUDA IPC)
    nwor-lab bench disagg --model 8b --transport nccl       # two GPUs: prefill on cuda:0, decode on cuda:1
    ... --prompt-len 500 --warmup 1 --repeats 3             # partial blocks; warmed, interleaved repeats

One engine: the prompts are queued and run to the end; its first step (the prefill, the first
token) is its TTFT, the rest divided by the tokens after the first its TPOT. Hand-off: the prefill
engine's step is the TTFT; the transfer (encode, send, receive, decode the frames) and the decode
engine's run make the TPOT. With `--transport gloo` both engines run in their own process (the
timings come from each rank; starting the processes is not counted). CPU timings on a shared
machine are noisy: read bytes and acceptance first. `--model 8b` (random bf16 weights, forced
acceptance, random prompts) runs on one GPU with `--transport cuda_ipc` (both engines on the same
card, the K/V rows handed over as CUDA IPC handles: nwor_lab.disagg.ipc) or `inprocess`; `8b-mini`
is the same path at toy size; `--transport nccl` puts the prefill engine on cuda:0 and the decode
engine on cuda:1 (the rows go GPU to GPU; unverified here, no GPU: tests/gpu/today_run.sh nccl).

Repeats (`--repeats N`, `--warmup W`, the two-process transports): one pair of processes per write
policy runs W warm-up rounds of every item, then N rounds of [one engine, each strategy] in turn
(ABBA: `bench.timing.in_turn`), each round on fresh engines over the same weights, so the
one-engine reference is warmed and timed on the decode rank's GPU between the hand-offs. Rows give
the median of the repeats with min-max and every value (`*_reps`), and `vs_one_engine`: the median
of per-repeat ratios (hand-off over the same repeat's one engine) with min-max. `--profile PATH`
adds one last round of the last strategy, rank 1's receive and decode under torch.profiler (a
Chrome trace at PATH), summarised in the JSON's `overlap` (bench.trace_profile.handoff_overlap):
whether any transfer kernel ran during a decode step. The protocol ships, then decodes: it should
say none did.
"""
from __future__ import annotations

import json
import platform
import sys

from nwor_lab.bench.output import save_json
from nwor_lab.bench.spread import put_spread
from nwor_lab.bench.spread import spread as spread_of
from nwor_lab.commandline import args as types
from nwor_lab.commandline.errors import LabArgumentParser
from nwor_lab.config import LabConfig, nwor_modes

BLOCK = 16          # the engines' block size: a prompt of n tokens leaves n % BLOCK rows in a partial block
PROMPTS = ["Once upon a time, there was a little girl named Lily. She", "The cat sat on the mat and",
           "Tom and his dog went to the park. They", "One day, a big bird"]


def one_engine(make, prompts, new: int, device=None) -> dict:
    import torch

    from nwor_lab.disagg.ranks import one_engine_round
    sync = torch.cuda.synchronize if device is not None and device.type == "cuda" else (lambda: None)
    r = one_engine_round(make(), prompts, new, sync)
    after_first = sum(len(t) - 1 for t in r["token_ids"])
    return {"tokens": r["token_ids"], "ttft_s": r["prefill_s"], "tpot_s": r["decode_s"] / max(after_first, 1),
            "mean_acceptance_length": r["mean_acceptance_length"]}


def workload(args, device):
    """-> (EnginePair factory by write policy, prompts, the model's words for the JSON)."""
    import torch

    from nwor_lab.disagg import EnginePair
    if args.model == "tiny":
        from nwor_lab.model.shipped import load_tiny
        _, _, tok = load_tiny()
        prompts = [tok.encode(t).ids for t in PROMPTS]
        kw = (("k", args.k), ("num_blocks", 128), ("block_size", BLOCK), ("temperature", args.temperature))
        return (lambda mode: EnginePair("tiny", 0, LabConfig(nwor_mode=mode), kw)), prompts, "tiny (shipped pair)"
    # random weights (8b on CUDA, 8b-mini its toy-size twin): random prompts, forced acceptance
    from nwor_lab.model.shapes import SHAPES
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, SHAPES[args.model]["vocab_size"], (args.prompt_len,), generator=g).tolist()
               for _ in range(args.prompts)]
    per = -(-(args.prompt_len + args.max_new_tokens + args.k + 1) // BLOCK)
    kw = (("k", args.k), ("num_blocks", args.prompts * per + 1), ("block_size", BLOCK), ("temperature", args.temperature),
          ("max_num_seqs", args.prompts), ("max_num_batched_tokens", max(1024, args.prompts * args.prompt_len)))
    words = f"{args.model} shape, random weights, {args.head} head, forced acceptance {args.acceptance!r}"
    return (lambda mode: EnginePair(args.model, 0, LabConfig(nwor_mode=mode, cuda_graph=False), kw, args.head,
                                    args.acceptance)), prompts, words


SPREAD = ("ttft_s", "tpot_s", "transfer_s", "decode_s")


def spread(rows: list[dict], keys=SPREAD) -> dict:
    """Per key: the median of the rows' values, `_min`, `_max` and every value in run order (`_reps`)."""
    out = {"repeats": len(rows)}
    for key in keys:
        put_spread(out, key, [r[key] for r in rows])
    return out


def handoff_row(mode: str, res, ref_tokens, s, temperature) -> dict:
    after_first = sum(len(t) - 1 for t in res.token_ids)
    return {"nwor": mode, **res.summary(), "ttft_s": res.prefill_s,
            "tpot_s": (res.transfer_s + res.decode_s) / max(after_first, 1),
            "tokens_equal_one_engine": res.token_ids == ref_tokens,
            "declared_exact": s.exact_sampled if temperature else s.exact_greedy,
            "junk_rows": sum(res.junk_rows), **{k: v for k, v in res.extra.items() if k.endswith(("bytes", "device"))}}


def one_engine_row(mode: str, ref: dict) -> dict:
    return {"nwor": mode, "strategy": "one engine", "ttft_s": ref["ttft_s"], "tpot_s": ref["tpot_s"],
            "transfer_s": 0.0, "decode_s": ref.get("decode_s", 0.0),
            "mean_acceptance_length": ref["mean_acceptance_length"], "kv_bytes": 0, "frame_bytes": 0}


def single_runs(pair, prompts, args, device, mode) -> list[dict]:
    """One run per strategy (the reference in this process): in process, or over a transport."""
    import torch

    from nwor_lab.disagg import handoff, handoff_strategy, run_handoff
    ref = one_engine(lambda: pair.build(device), prompts, args.max_new_tokens, device)
    if device.type == "cuda":
        torch.cuda.empty_cache()        # the reference engine's memory back before two more engines
    rows = [one_engine_row(mode, ref)]
    print(json.dumps(rows[-1]), flush=True)
    for name in args.strategies:
        if args.transport == "inprocess":
            res = handoff(pair.build(device), pair.build(device), prompts, args.max_new_tokens, name)
        else:
            res = run_handoff(pair, prompts, args.max_new_tokens, name, transport=args.transport, timeout_s=300.0)
        rows.append(handoff_row(mode, res, ref["tokens"], handoff_strategy(name), args.temperature))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def schedule_for(strategies, warmup: int, repeats: int) -> tuple[list, list]:
    """-> (the rounds' items: `warmup` rounds of every item, then `repeats` rounds of [one engine,
    *strategies] in turn (ABBA); each round's repeat index, -1 for a warm-up)."""
    from nwor_lab.bench.timing import in_turn
    from nwor_lab.disagg import ONE_ENGINE
    items = [ONE_ENGINE, *strategies]
    sched, reps = [], []
    for _ in range(warmup):
        sched += items
        reps += [-1] * len(items)
    for i in range(repeats):
        turn = in_turn(items, i)
        sched += turn
        reps += [i] * len(turn)
    return sched, reps


def repeated_runs(pair, prompts, args, mode) -> tuple[list[dict], dict | None]:
    """Warm-up rounds, then interleaved repeats, in one pair of processes (`run_rounds`) -> rows with
    spread and per-repeat ratios to one engine; the overlap summary when `--profile`."""
    from nwor_lab.disagg import ONE_ENGINE, handoff_strategy, run_rounds
    sched, reps = schedule_for(args.strategies, args.warmup, args.repeats)
    profile_round = None
    if args.profile:
        sched, reps = sched + [args.strategies[-1]], reps + [-2]
        profile_round = len(sched) - 1
    got = run_rounds(pair, prompts, args.max_new_tokens, sched, transport=args.transport, timeout_s=600.0,
                     profile_round=profile_round, profile_to=args.profile)
    ref = {}
    for item, rep, res in zip(sched, reps, got):
        if item == ONE_ENGINE and rep >= 0:
            after_first = sum(len(t) - 1 for t in res["token_ids"])
            ref[rep] = {"tokens": res["token_ids"], "ttft_s": res["prefill_s"], "decode_s": res["decode_s"],
                        "tpot_s": res["decode_s"] / max(after_first, 1),
                        "mean_acceptance_length": res["mean_acceptance_length"]}
    ref_rows = [one_engine_row(mode, ref[i]) for i in range(args.repeats)]
    one = {**ref_rows[0], **spread(ref_rows),
           "tokens_equal_across_repeats": all(ref[i]["tokens"] == ref[0]["tokens"] for i in ref)}
    rows = [one]
    print(json.dumps({k: v for k, v in one.items() if not k.endswith("_reps")}), flush=True)
    for name in args.strategies:
        s = handoff_strategy(name)
        runs = [(rep, handoff_row(mode, res, ref[rep]["tokens"], s, args.temperature))
                for item, rep, res in zip(sched, reps, got) if item == name and rep >= 0]
        per = [r for _, r in runs]
        row = {**per[0], **spread(per), "tokens_equal_one_engine": all(r["tokens_equal_one_engine"] for r in per),
               "warmup_rounds": args.warmup}
        row.pop("prefill_s", None)            # the first repeat's; `ttft_s` is the prefill, with spread
        row["vs_one_engine"] = {}
        for key in ("ttft_s", "tpot_s"):
            ratios = [r[key] / ref[rep][key] for rep, r in runs if ref[rep][key] > 0]
            if ratios:
                row["vs_one_engine"][key] = spread_of(ratios)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if not k.endswith("_reps")}), flush=True)
    overlap = None
    if args.profile:
        from nwor_lab.bench.trace_profile import handoff_overlap, load_trace
        overlap = {"strategy": args.strategies[-1], "trace": args.profile,
                   **handoff_overlap(load_trace(args.profile))}
    return rows, overlap


def main(argv=None) -> dict:
    import torch

    from nwor_lab.bench.engine8b import acceptance_text
    from nwor_lab.bench.timing import bench_device
    from nwor_lab.disagg import HANDOFF_STRATEGIES
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
    p.add_argument("--prompt-len", type=types.integer(1, 8192), default=512,
                   help="8B shapes: tokens per prompt (not a multiple of 16: partial blocks, write_all ships junk)")
    p.add_argument("--strategies", type=types.listed(types.one_of(tuple(HANDOFF_STRATEGIES)), "strategies"),
                   default=("nwor", "write_all", "no_head"), help="hand-off strategies, comma-separated")
    p.add_argument("--nwor", type=types.listed(types.one_of(nwor_modes()), "write policies"), default=("off", "stage"))
    p.add_argument("--transport", choices=TRANSPORTS, default="inprocess",
                   help="inprocess; gloo (two processes, CPU); cuda_ipc (two processes sharing one GPU); "
                        "nccl (two processes, prefill on cuda:0, decode on cuda:1)")
    p.add_argument("--k", type=types.integer(1, 16), default=4)
    p.add_argument("--max-new-tokens", type=types.integer(2, 512), default=32)
    p.add_argument("--temperature", type=types.temperature, default=0.0, help="0: greedy; > 0: seeded sampling")
    p.add_argument("--repeats", type=types.integer(1, 100), default=1,
                   help="timed rounds per strategy, interleaved with one engine's (two-process transports; "
                        "1 with --warmup 0: one run each, the reference in this process)")
    p.add_argument("--warmup", type=types.integer(0, 10), default=0,
                   help="untimed rounds of every item before the repeats (two-process transports)")
    p.add_argument("--profile", type=types.output_file, default=None,
                   help="a Chrome trace of one more round (the last strategy) on the decode rank; its overlap "
                        "summary goes in the JSON (two-process transports)")
    p.add_argument("--out", type=types.output_file, default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    device = bench_device("disagg", args.device, args.model, default_cuda=args.model == "8b")
    if args.transport == "cuda_ipc" and device.type != "cuda":
        p.error("--transport cuda_ipc: two processes share one GPU's memory; give a CUDA --device "
                "(or --transport gloo on the CPU)")
    if args.transport == "nccl" and (device.type != "cuda" or torch.cuda.device_count() < 2):
        p.error(f"--transport nccl: the prefill and decode engines need a GPU each (cuda:0 and cuda:1), "
                f"{torch.cuda.device_count()} visible; on one GPU use --transport cuda_ipc, on the CPU gloo")
    if args.transport == "gloo" and device.type != "cpu":
        p.error("--transport gloo runs both engines on the CPU here; on one GPU use --transport cuda_ipc")
    repeated = args.repeats > 1 or args.warmup > 0 or args.profile is not None
    if repeated and args.transport == "inprocess":
        p.error("--repeats, --warmup and --profile run the two-process protocol: give --transport gloo, cuda_ipc "
                "or nccl")
    make_pair, prompts, words = workload(args, device)
    rows, overlaps = [], {}
    for mode in args.nwor:
        pair = make_pair(mode)
        if repeated:
            got, overlap = repeated_runs(pair, prompts, args, mode)
            rows += got
            if overlap is not None:
                overlaps[mode] = overlap
        else:
            rows += single_runs(pair, prompts, args, device, mode)
    if device.type != "cuda":
        cards = ["cpu"]
    elif args.transport == "nccl":
        cards = [f"cuda:{i} {torch.cuda.get_device_name(i)}" for i in range(2)]
    else:
        cards = [torch.cuda.get_device_name(device)]
    out = {"command": "nwor-lab bench disagg " + " ".join(argv if argv is not None else sys.argv[1:]),
           "model": words, "device": cards[0] if len(cards) == 1 else " | ".join(cards), "devices": cards,
           "machine": platform.node(), "transport": args.transport, "prompts": len(prompts),
           "prompt_tokens": sum(len(x) for x in prompts),
           "rows_in_partial_blocks": sum(len(x) % BLOCK for x in prompts),
           "max_new_tokens": args.max_new_tokens, "k": args.k, "temperature": args.temperature,
           "repeats": args.repeats, "warmup": args.warmup, "rows": rows}
    if overlaps:
        out["overlap"] = overlaps
    save_json(out, args.out, indent=2)
    return out


if __name__ == "__main__":
    main()
