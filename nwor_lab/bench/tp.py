"""Benchmark (not a test): verify-step time and tokens/s of the engine at tp = 1 vs tp = 2 (or any
list), random weights of a Llama-3-8B-shaped target (32 layers, 32 q / 8 KV heads x 128, hidden
4096, MLP 14336, vocab 128256) with an EAGLE-1-shaped head, on rank-per-GPU NCCL.

    nwor-lab bench tp --tp 1,2 --device cuda --out benchmarks/results/step_tp_h200.json
    nwor-lab bench tp --tp 1,2 --model tiny --device cpu --steps 4        # a CPU smoke run

Each tp runs in its own freshly started ranks (`nwor_lab.distributed.launch`). Per configuration
(batch size x k x write policy) the engine prefills `batch` random prompts, runs `--warmup` steps,
then times `--steps` engine steps (schedule, target forward, sampling and its broadcast, head pass,
commit, drafting) on rank 0 with the device synchronised around each. Random weights accept almost
no draft, so tokens/s here is mostly one token per request per step: compare the step times.
The 8B shape needs about 16 GB of bf16 weights per tp=1 rank (an H100 or H200).
"""
from __future__ import annotations

import json
import platform
import statistics
import sys
import time

import torch

from nwor_lab.bench.output import save_json
from nwor_lab.config import SCV_MODES, LabConfig, nwor_modes
from nwor_lab.commandline import args as types
from nwor_lab.commandline.errors import LabArgumentParser
from nwor_lab.model.config import LlamaConfig

SHAPES = {
    "llama3-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=500000.0,
                      max_position_embeddings=8192),
    "tiny": dict(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=8,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024),
}
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _rank_bench(group, shape: str, dtype, configs: list[dict], prompt_len: int, warmup: int, steps: int,
                block_size: int) -> list[dict]:
    """One rank: every configuration on the same random shards; rank 0's timings come back."""
    from nwor_lab.distributed.engine import TPSpecEngine
    from nwor_lab.distributed.shard import random_shards
    cfg = LlamaConfig(**SHAPES[shape])
    target, head = random_shards(cfg, group, head=True, device=group.device, dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for c in configs:
        bs, k = c["batch_size"], c["k"]
        per_req = prompt_len + (warmup + steps + 2) * (k + 1) + k
        engine = TPSpecEngine(target, head if k else None, LabConfig(nwor_mode=c["nwor"], scv_mode=c["scv"]),
                              group=group, k=k, num_blocks=bs * -(-per_req // block_size) + 1, block_size=block_size,
                              max_num_seqs=bs, max_num_batched_tokens=max(1024, bs * prompt_len))
        for _ in range(bs):
            engine.add_request(torch.randint(0, cfg.vocab_size, (prompt_len,), generator=gen).tolist(),
                               max_new_tokens=(warmup + steps + 2) * (k + 1))
        engine.step()                                    # the prefill (not timed)
        for _ in range(warmup):
            engine.step()
        group.barrier()
        times, emitted = [], 0
        for _ in range(steps):
            before = sum(len(r.output) for r in engine.scheduler.running)
            _sync(group.device)
            t0 = time.perf_counter()
            engine.step()
            _sync(group.device)
            times.append(time.perf_counter() - t0)
            emitted += sum(len(r.output) for r in engine.scheduler.running) - before
        verify = [w for w in engine.trace[-2 * steps:] if w.kind == "verify"]
        acc = [a + 1 for w in verify for n, a in zip(w.drafted, w.accepted) if n]
        rows.append({**c, "tp": group.world_size, "step_ms_median": round(1e3 * statistics.median(times), 3),
                     "step_ms_mean": round(1e3 * statistics.mean(times), 3),
                     "tokens_per_s": round(emitted / sum(times), 2),
                     "mean_acceptance_length": round(statistics.mean(acc), 3) if acc else None,
                     "replayed_steps": engine.runner.replays})
        del engine
        if group.device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def main(argv=None) -> dict:
    p = LabArgumentParser(prog="nwor-lab bench tp", description=__doc__.split("\n\n")[0])
    p.add_argument("--tp", type=types.listed(types.integer(1, 64), "rank counts"), default=(1, 2),
                   help="tensor-parallel sizes to compare, comma-separated")
    p.add_argument("--model", choices=sorted(SHAPES), default=None,
                   help="shape of the random target (default: llama3-8b on cuda, tiny on cpu)")
    p.add_argument("--device", type=types.device, default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--batch-sizes", type=types.listed(types.integer(1, 4096), "batch sizes"), default=(1, 8))
    p.add_argument("--k", type=types.listed(types.integer(0, 64), "draft counts"), default=(0, 4),
                   help="drafts per window, comma-separated (0: target only)")
    p.add_argument("--nwor", type=types.listed(types.one_of(nwor_modes()), "write policies"), default=("off", "stage"),
                   help="write policies, comma-separated")
    p.add_argument("--scv", choices=SCV_MODES, default="graph")
    p.add_argument("--prompt-len", type=types.integer(1, 1 << 20), default=128)
    p.add_argument("--warmup", type=types.integer(0, 10000), default=3)
    p.add_argument("--steps", type=types.integer(1, 100000), default=20)
    p.add_argument("--block-size", type=types.integer(1, 4096), default=16)
    p.add_argument("--timeout", type=types.seconds, default=300.0, help="collective timeout per rank, seconds")
    p.add_argument("--out", type=types.output_file, default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    from nwor_lab.commandline.environment import check_device_arg
    from nwor_lab.distributed.launcher import launch
    device = check_device_arg("--device", args.device)
    shape = args.model or ("llama3-8b" if device.type == "cuda" else "tiny")
    dtype = DTYPES[args.dtype or ("bfloat16" if device.type == "cuda" else "float32")]
    configs = [{"batch_size": b, "k": k, "nwor": m, "scv": args.scv}
               for b in args.batch_sizes for k in args.k for m in (args.nwor if k else ["off"])]
    rows = []
    for tp in args.tp:
        per_rank = launch(_rank_bench, tp, (shape, dtype, configs, args.prompt_len, args.warmup, args.steps,
                                            args.block_size), device=device, timeout_s=args.timeout)
        for row in per_rank[0]:
            print(json.dumps(row), flush=True)
            rows.append(row)
    base = {(r["batch_size"], r["k"], r["nwor"]): r for r in rows if r["tp"] == 1}
    for r in rows:
        b = base.get((r["batch_size"], r["k"], r["nwor"]))
        r["speedup_vs_tp1"] = round(b["step_ms_median"] / r["step_ms_median"], 3) if b else None
    out = {"command": "nwor-lab bench tp " + " ".join(argv if argv is not None else sys.argv[1:]),
           "model": shape, "shape": SHAPES[shape], "dtype": str(dtype).replace("torch.", ""),
           "device": (torch.cuda.get_device_name(device) if device.type == "cuda" else
                      f"cpu ({platform.processor() or platform.machine()})"),
           "backend": "nccl" if device.type == "cuda" else "gloo", "torch": torch.__version__,
           "weights": "random (same seed on every rank)", "results": rows}
    save_json(out, args.out)
    return out


if __name__ == "__main__":
    main()
