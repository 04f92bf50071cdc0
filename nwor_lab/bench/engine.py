"""Benchmark (not a test): tokens/s of target-only vs EAGLE speculative decoding, shipped pair.

    nwor-lab bench engine --device cpu --out benchmarks/results/engine_cpu.json
    nwor-lab bench engine --model 8b ...     the Llama-3-8B-shaped pair (nwor_lab/bench/engine8b.py)

Prompts are held-out text (modules the pair never saw, `nwor_lab.train.corpus.HELD_OUT`): from
`runs/corpus/eval.bin` when present, else tokenised from this interpreter's stdlib. Each
configuration builds ONE engine and runs the prompts on it twice untimed (the cold run compiles the
Triton kernel variants and warms every batch bucket up, the second captures each bucket's CUDA
graph, as a server does at start-up), then queues the same prompts again `--repeats` times and
times each run end to end (scheduling, prefill, sampling, drafting included; model load
excluded); `seconds` is their median, `repeat_seconds` all of them, `cold_seconds` the first run.
Greedy unless --temperature says otherwise; float32 weights and cache unless --dtype says otherwise.
"""
from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

import numpy as np
import torch

from nwor_lab.bench.output import save_json
from nwor_lab.config import SCV_MODES, LabConfig, nwor_modes
from nwor_lab.bench.timing import device_name, time_engine, timed
from nwor_lab.commandline import args as types
from nwor_lab.commandline.errors import LabArgumentParser
from nwor_lab.engine.generate import acceptance_stats, prepare
from nwor_lab.model.shipped import load_tiny
from nwor_lab.ops import backend


def held_out_stream(tokenizer) -> np.ndarray:
    packed = Path("runs/corpus/eval.bin")
    if packed.is_file():
        return np.fromfile(packed, dtype=np.uint16)
    # tokenizers' thread pool would keep competing with torch for the CPU during the timing
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from nwor_lab.train.corpus import encode_files, split
    return encode_files(tokenizer, split()[1])


def prompts_from(stream: np.ndarray, n: int, length: int, seed: int = 7) -> list[list[int]]:
    gen = np.random.default_rng(seed)
    return [stream[s:s + length].astype(np.int64).tolist() for s in gen.integers(0, stream.size - length, n)]


def hf_generate_rows(prompts: list[list[int]], batch_sizes, new_tokens: int, device,
                     dtype=torch.float32, repeats: int = 3) -> list[dict]:
    """Hugging Face `generate` (greedy, no speculation) of the same target checkpoint, when
    transformers is importable: the outside baseline, timed the same way. Prompts have equal
    lengths, so batches need no padding."""
    try:
        from transformers import AutoModelForCausalLM
    except ImportError:
        return []
    from nwor_lab.model.shipped import TINY_DIR
    try:
        model = AutoModelForCausalLM.from_pretrained(TINY_DIR, torch_dtype=dtype).to(device).eval()
    except Exception as err:   # noqa: BLE001 - a baseline that cannot load is reported, not fatal
        return [{"config": "hf-generate greedy", "error": f"{type(err).__name__}: {err}"}]
    rows = []
    for bs in batch_sizes:
        # the same prompts as the lab's rows: at batch 1, two prompts one after the other
        batches = [prompts[i:i + 1] for i in range(2)] if bs == 1 else [prompts[:bs]]

        def go(n=new_tokens):
            with torch.no_grad():
                return [model.generate(torch.tensor(b, device=device), max_new_tokens=n, min_new_tokens=n,
                                       do_sample=False, pad_token_id=0) for b in batches]
        go(8)
        runs = [timed(go, device) for _ in range(repeats)]
        outs, secs = runs[0][0], float(np.median([t for _, t in runs]))
        ntok = sum((o.shape[1] - len(b[0])) * o.shape[0] for o, b in zip(outs, batches))
        rows.append({"batch_size": bs, "config": "hf-generate greedy", "k": 0, "requests": sum(map(len, batches)),
                     "tokens": ntok, "seconds": round(secs, 4), "tokens_per_s": round(ntok / secs, 2)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None) -> dict:
    argv_list = list(sys.argv[1:] if argv is None else argv)
    model = next((a.split("=", 1)[1] if "=" in a else (argv_list[i + 1] if i + 1 < len(argv_list) else "")
                  for i, a in enumerate(argv_list) if a == "--model" or a.startswith("--model=")), "shipped")
    if model != "shipped":            # the 8B-shaped random pair: its own options (bench/engine8b.py)
        from nwor_lab.bench.engine8b import main as main_8b
        return main_8b(argv_list)
    p = LabArgumentParser(prog="nwor-lab bench engine", description=__doc__.splitlines()[0])
    p.add_argument("--model", type=types.one_of(("shipped", "8b", "8b-mini")), default="shipped",
                   help="shipped (this parser), or 8b / 8b-mini: the Llama-3-8B-shaped random pair with "
                        "forced acceptance (`nwor-lab bench engine --model 8b --help`)")
    p.add_argument("--device", type=types.device, default="cpu")
    p.add_argument("--prompts", type=types.integer(1, 4096), default=8)
    p.add_argument("--prompt-len", type=types.integer(1, 1 << 20), default=64)
    p.add_argument("--new-tokens", type=types.integer(1, 1 << 20), default=96)
    p.add_argument("--batch-sizes", type=types.listed(types.integer(1, 4096), "batch sizes"), default=(1, 8))
    p.add_argument("--k", type=types.integer(0, 1024), default=4)
    p.add_argument("--head", choices=("eagle1", "eagle3"), default="eagle1")
    p.add_argument("--scv", type=types.listed(types.one_of(SCV_MODES), "SCV modes"), default=("off", "graph"),
                   help=f"SCV modes to pair with every write policy, comma-separated ({', '.join(SCV_MODES)})")
    p.add_argument("--attention", default="auto", choices=("auto", "triton", "torch"),
                   help="verify-window attention (LabConfig.attention)")
    p.add_argument("--no-hf", action="store_true", help="skip the Hugging Face generate baseline")
    p.add_argument("--no-cuda-graph", action="store_true",
                   help="every step eager (default on CUDA: steady steps replayed from CUDA graphs)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
                   help="weights, activations and cache (the shipped pair is stored in bfloat16)")
    p.add_argument("--repeats", type=types.integer(1, 1000), default=3,
                   help="timed runs per configuration (the median is reported)")
    p.add_argument("--temperature", type=types.temperature, default=0.0,
                   help="sampling temperature of every engine (0: greedy; the same seed in every engine)")
    p.add_argument("--out", type=types.output_file, default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    from nwor_lab.commandline.environment import check_device_arg
    device = check_device_arg("--device", args.device)
    dtype = getattr(torch, args.dtype)
    target, head, tok = load_tiny(device=device, head=args.head, dtype=dtype)
    prompts = prompts_from(held_out_stream(tok), args.prompts, args.prompt_len)
    graphs = not args.no_cuda_graph
    configs = [("target-only", 0, LabConfig(attention=args.attention, cuda_graph=graphs))] + [
        (f"{args.head} k={args.k} nwor={m} scv={s}", args.k,
         LabConfig(nwor_mode=m, scv_mode=s, attention=args.attention, cuda_graph=graphs))
        for m in nwor_modes() for s in args.scv]
    rows = []
    for bs in args.batch_sizes:
        ps = prompts[:max(bs, 2)] if bs == 1 else prompts[:bs]
        base_ids, base_tps = None, None
        for name, k, cfg in configs:
            gen = prepare(ps, args.new_tokens, k, cfg, target=target, head=head, tokenizer=tok, device=device,
                          max_num_seqs=bs, dtype=dtype, temperature=args.temperature)
            engine = gen.engine
            _, cold = timed(engine.run, device)     # compiles, warms every bucket up (the queued prompts)
            run = time_engine(engine, ps, args.new_tokens, args.repeats, device, cold=cold)
            times, secs = run["times"], run["seconds"]
            token_ids = [r.output for r in run["requests"]]
            mean, by_pos = acceptance_stats(run["trace"], max(k, 1))
            forwards = run["forwards"]
            ntok = sum(len(t) for t in token_ids)
            tps = ntok / secs
            if k == 0:
                base_ids, base_tps = token_ids, tps
            graphed = engine.runner
            row = {"batch_size": bs, "config": name, "k": k, "nwor": cfg.nwor_mode, "scv": cfg.scv_mode,
                   "requests": len(ps), "tokens": ntok, "seconds": round(secs, 4), "tokens_per_s": round(tps, 2),
                   "cold_seconds": round(cold, 4), "repeat_seconds": [round(t, 4) for t in times],
                   "speedup_vs_target_only": round(tps / base_tps, 3),
                   "target_forwards": forwards,
                   "graphed_steps": graphed.graphed_steps,
                   "chained_steps": graphed.graphed_steps if engine.drafting else 0,
                   "prelaunched_steps": graphed.prelaunched,
                   "graphs_at_start": list(graphed.startup_capture) if graphed.startup_capture else None,
                   "mean_acceptance_length": round(mean, 3) if k else None,
                   "acceptance_by_position": [round(a, 3) for a in by_pos] if k else None,
                   # (sampled: the engines draw differently, so only greedy runs compare tokens)
                   "same_tokens_as_target_only": token_ids == base_ids if args.temperature == 0 else None}
            rows.append(row)
            print(json.dumps(row), flush=True)
    sizes = list(args.batch_sizes)
    if not args.no_hf:
        rows += hf_generate_rows(prompts, sizes, args.new_tokens, device, dtype, args.repeats)
    out = {"command": "nwor-lab bench engine " + " ".join(argv if argv is not None else sys.argv[1:]),
           "device": device_name(device),
           "torch": torch.__version__, "python": platform.python_version(), "dtype": args.dtype,
           "attention": args.attention, "cuda_graph": graphs and device.type == "cuda",
           "temperature": args.temperature,
           "ops_backend": vars(backend(device)),
           "prompts": f"{len(prompts)} held-out prompts x {args.prompt_len} tokens, {args.new_tokens} new tokens each",
           "results": rows}
    save_json(out, args.out)
    return out


if __name__ == "__main__":
    main()
