"""Sliding-window strategies side by side: correctness, KV memory per request, mean accepted
length, tokens/s (LabConfig.sliding_window + kv_ring + nwor_mode; nwor_lab.engine.ring).

    nwor-lab bench ring --device cpu --out benchmarks/results/ring_cpu.json
        the shipped pair through the engine: the same held-out prompts under every strategy,
        compared with target-only greedy decoding with the same W
    nwor-lab bench ring --model 8b --windows 512,4096 --out benchmarks/results/ring_8b.json   (CUDA)
        the 8B-shaped verify step of `bench step` (random bf16 weights, forced acceptance), one
        step per strategy on the same logical context, captured in a CUDA graph and replayed
        round-robin; correctness = the step's final hidden states equal the whole-context cache's
        (within 1 % of their largest value; `bit_identical_to_full` says whether to the bit)

Strategies (write policy + cache): off+ring (W slots, write-all: wrong once the ring wraps),
off+slack (W + k slots, llama.cpp), off+full (no ring), off+guard (W slots, no drafts once
wrapped, mlx-lm), cow+ring (the log serves the evicted rows), stage+ring (the window waits in the
staging buffer, mlx-swift-lm #516). Memory per request: the ring's slots (or the context) for its
whole life, plus the staging / log rows a policy holds while a window is open.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from nwor_lab.bench.output import save_json
from nwor_lab.bench.timing import device_name
from nwor_lab.config import KV_RINGS, LabConfig
from nwor_lab.engine.ring import exact_by_design, kv_memory, sliding_window_for, strategy_name
from nwor_lab.engine.trace import first_divergence
from nwor_lab.policies import POLICIES, make_policy



def ring_strategies() -> tuple[tuple[str, str], ...]:
    """The (nwor_mode, kv_ring) pairs the bench compares, from what each registered policy declares:
    one that keeps a ring of W slots exact (`keeps_ring_exact`) on that ring; any other on the ring it
    corrupts and under every fix (slack, full, guard). Built-ins: off x 4, cow + ring, stage + ring."""
    rings = tuple(r for r in KV_RINGS if r != "auto")
    return tuple((mode, ring) for mode, cls in POLICIES.items()
                 for ring in (("ring",) if cls.keeps_ring_exact() else rings))


# -- the shipped pair, through the engine ------------------------------------------------------
def compare_strategies(prompts, *, sliding_window: int, k: int, new_tokens: int, target, head, tokenizer=None,
                       device="cpu", dtype=torch.float32, batch: int = 4, block_size: int = 16,
                       cache_dtype: str = "auto", attention: str = "auto", repeats: int = 1,
                       strategies=None) -> list[dict]:
    """Target-only greedy decoding with W = `sliding_window`, then every (nwor_mode, kv_ring) of
    `strategies` (default: `ring_strategies()`) with `k` drafts, on the same prompts (token id lists,
    each <= W long) -> one row each: correctness against target-only (and the first divergence), KV memory per request, mean
    acceptance length, tokens per request and decode step, tokens/s (median of `repeats` timed
    runs on a warm engine, the strategies timed round-robin)."""
    from nwor_lab.bench.timing import timed
    from nwor_lab.engine.generate import acceptance_stats, prepare

    device = torch.device(device)
    longest = max(len(p) for p in prompts)
    if longest > sliding_window:
        raise ValueError(f"prompts: one has {longest} tokens, more than the window {sliding_window}: a ring of W "
                         f"slots cannot hold it (the lab does not chunk prefills); shorten the prompts")
    configs = [("target-only", 0, LabConfig(sliding_window=sliding_window, kv_ring="full", attention=attention))]
    configs += [(f"{m}+{r}", k, LabConfig(nwor_mode=m, kv_ring=r, sliding_window=sliding_window, attention=attention))
                for m, r in (ring_strategies() if strategies is None else strategies)]
    # every engine built and warmed up first, then the timed runs round-robin (run r of every
    # strategy, then run r + 1): drift of a shared machine hits every strategy alike
    built = []
    for name, kk, cfg in configs:
        gen = prepare(prompts, new_tokens, kk, cfg, target=target, head=head, tokenizer=tokenizer, device=device,
                      dtype=dtype, max_num_seqs=batch, block_size=block_size, cache_dtype=cache_dtype)
        gen.engine.run()                                       # warm-up: first-call allocations untimed
        built.append((name, kk, cfg, gen, [list(r.output) for r in gen.requests], len(gen.engine.trace),
                      gen.engine.target_forwards))
    times = {name: [] for name, *_ in built}
    last = {}
    for _ in range(max(1, repeats)):
        for name, kk, cfg, gen, *_ in built:
            last[name] = [gen.engine.add_request(p, new_tokens) for p in prompts]
            times[name].append(timed(gen.engine.run, device)[1])
    rows, reference = [], None
    for name, kk, cfg, gen, first, start, forwards in built:
        engine = gen.engine
        secs = statistics.median(times[name])
        ntok = sum(len(r.output) for r in last[name])
        trace = engine.trace[start:]
        verify = [t for t in trace if t.kind == "verify"]
        mean, by_pos = acceptance_stats(trace, max(kk, 1))
        decode = [(n, e) for t in verify for n, e, kind in zip(t.drafted, t.emitted, t.kinds) if kind != "prefill"]
        if kk == 0:
            reference = first
        d = first_divergence(first, reference)
        div = None if d is None else d.where()
        pol = POLICIES[cfg.nwor_mode]
        mem = kv_memory(engine.cache.spec, engine.sliding, pol, kk, longest + new_tokens + kk)
        rows.append({
            "sliding_window": sliding_window, "strategy": name, "nwor": cfg.nwor_mode, "kv_ring": cfg.kv_ring, "k": kk,
            "ring_slots": engine.sliding.ring_slots if engine.sliding else None,
            "correct": div is None, "exact_by_design": exact_by_design(cfg, pol), "first_divergence": div,
            "kv_slots_per_request": mem.slots, "kv_memory_per_request": mem.as_dict(),
            "mean_acceptance_length": round(mean, 3) if kk else None,
            "acceptance_by_position": [round(a, 3) for a in by_pos] if kk else None,
            "tokens_per_request_step": round(sum(len(e) for _, e in decode) / len(decode), 3) if decode else None,
            "windows_with_drafts": round(sum(1 for n, _ in decode if n) / max(1, len(decode)), 3),
            "target_forwards": (engine.target_forwards - forwards) // max(1, repeats),
            "tokens": ntok, "seconds": round(secs, 4), "tokens_per_s": round(ntok / secs, 2),
            "repeat_seconds": [round(t, 4) for t in times[name]], "token_ids": first})
    base = rows[0]["tokens_per_s"]
    for r in rows:
        r["speedup_vs_target_only"] = round(r["tokens_per_s"] / base, 3)
    return rows


def engine_rows(args, device, dtype) -> list[dict]:
    from nwor_lab.bench.engine import held_out_stream, prompts_from
    from nwor_lab.model.shipped import load_tiny

    target, head, tok = load_tiny(device=device, head=args.head, dtype=dtype)
    prompts = prompts_from(held_out_stream(tok), args.prompts, args.prompt_len)
    rows = []
    for w in [int(x) for x in args.windows.split(",")]:
        for row in compare_strategies(prompts, sliding_window=w, k=args.k, new_tokens=args.new_tokens, target=target,
                                      head=head, tokenizer=tok, device=device, dtype=dtype, batch=args.batch,
                                      block_size=args.block_size, cache_dtype=args.cache_dtype,
                                      attention=args.attention, repeats=args.repeats):
            row.pop("token_ids")
            rows.append(row)
            print(json.dumps({k_: v for k_, v in row.items() if k_ != "acceptance_by_position"}), file=sys.stderr,
                  flush=True)
    return rows


# -- the 8B-shaped verify step ----------------------------------------------------------------
def _round_robin_us(fns: dict, device, reps: int) -> dict:
    if device.type == "cuda":
        from nwor_lab.bench.kernels import interleaved_time_us
        return interleaved_time_us(fns, iters=3, reps=reps)
    times = {n: [] for n in fns}
    for fn in fns.values():
        fn()
    for _ in range(reps):
        for n, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[n].append((time.perf_counter() - t0) * 1e6)
    return {n: statistics.median(t) for n, t in times.items()}


def step_rows(args, device) -> list[dict]:
    """The engine's step (`bench step`'s StepCase: nwor_lab.engine.step.run_step) per strategy on the
    same prompts of W tokens each (a ring of W slots holds them; the first decode step wraps it),
    replayed from its CUDA graph where it is captured (cow on a ring runs eagerly), round-robin.
    Correct = the step's outputs (sampled ids, accepted lengths, next drafts) equal the
    whole-context cache's."""
    from nwor_lab.bench.step import StepCase, make_pair

    pair = make_pair(args.model, device)
    rows = []
    for w in [int(x) for x in args.windows.split(",")]:
        for batch in [int(b) for b in args.batches.split(",")]:
            cases, fns, outs = {}, {}, {}
            with torch.no_grad():
                # the guard never drafts once the ring is full: its reference is target-only decoding
                k0 = StepCase(pair, batch, 0, w, "off", args.rate, args.attention, graphs=False, sliding_window=w,
                              kv_ring="full")
                target_only = k0.eager()[0][:batch].cpu()
                del k0
            for mode, ring in (("off", "full"),) + tuple(s for s in ring_strategies() if s != ("off", "full")):
                name = f"{mode}+{ring}"
                with torch.no_grad():
                    case = StepCase(pair, batch, args.k, w, mode, args.rate, args.attention, graphs=args.graphs,
                                    sliding_window=w, kv_ring=ring)
                    # a fresh step first (a repeated step on a ring reads what its own commit evicted)
                    packed, g, _ = case.eager()
                    outs[name] = (packed[:batch].cpu(), g[:batch].float().cpu())
                cases[name] = case
                graphed = case.inputs is not None and case.inputs.graph is not None
                fns[name] = case.replay if graphed else case.eager
            with torch.no_grad():
                us = _round_robin_us(fns, device, args.reps)
            ref, ref_g = outs["off+full"]
            rows_here = []
            for name, case in cases.items():
                e = case.engine
                k = e.k
                packed, g = outs[name]
                guard = e.sliding is not None and e.sliding.guard
                same = torch.equal(packed[:, 0], target_only[:, 0]) if guard else \
                    torch.equal(packed[:, :k + 2], ref[:, :k + 2])
                diff = None if guard else float((g - ref_g).abs().max())
                correct = same and (diff is None or diff <= 1e-2 * float(ref_g.abs().max()))
                accepted = float(packed[:, k + 1].float().mean())
                mem = kv_memory(e.cache.spec, e.sliding, POLICIES[e.config.nwor_mode], k, w + 2 * k + 40)
                rows_here.append({
                    "model": args.model, "sliding_window": w, "context": w, "batch": batch, "k": k,
                    "strategy": name, "ring_slots": e.sliding.ring_slots if e.sliding else None,
                    "correct": correct, "max_abs_diff_vs_full": diff, "graphed": fns[name] == case.replay,
                    "kv_slots_per_request": mem.slots, "kv_memory_per_request": mem.as_dict(),
                    "mean_acceptance_length": 1 + accepted, "step_us": round(us[name], 1),
                    "tokens_per_s": round(batch * (1 + accepted) / (us[name] * 1e-6), 1)})
            slack = next(r for r in rows_here if r["strategy"] == "off+slack")["tokens_per_s"]
            for r in rows_here:
                r["tokens_per_s_vs_slack"] = round(r["tokens_per_s"] / slack, 4)
                print(json.dumps(r), file=sys.stderr, flush=True)
            rows += rows_here
            del cases, fns
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="nwor-lab bench ring", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="shipped", choices=("shipped", "8b"),
                   help="shipped: the engine on the tiny pair; 8b: the verify step of `bench step`")
    p.add_argument("--path", choices=("engine", "step"), default=None,
                   help="engine (default for shipped) or step (default for 8b; shipped works too, e.g. on CPU)")
    p.add_argument("--device", default=None, help="default: cuda when present, else cpu")
    p.add_argument("--windows", default=None, help="sliding windows W, comma separated (default 64 engine, "
                                                   "512,4096 step)")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--attention", default="auto", choices=("auto", "triton", "torch"))
    p.add_argument("--out", default=None, help="write the JSON here")
    g = p.add_argument_group("engine path")
    g.add_argument("--prompts", type=int, default=4)
    g.add_argument("--prompt-len", type=int, default=32, help="<= W: a ring holds the whole prompt")
    g.add_argument("--new-tokens", type=int, default=160)
    g.add_argument("--batch", type=int, default=4, help="requests decoded together (max_num_seqs)")
    g.add_argument("--head", choices=("eagle1", "eagle3"), default="eagle1")
    g.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    g.add_argument("--cache-dtype", default="auto")
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--repeats", type=int, default=5, help="timed runs per strategy, round-robin (median)")
    s = p.add_argument_group("step path")
    s.add_argument("--batches", default="1,8")
    s.add_argument("--rate", type=float, default=0.5, help="forced acceptance rate")
    s.add_argument("--reps", type=int, default=15)
    s.add_argument("--no-graphs", dest="graphs", action="store_false", help="time eager steps")
    args = p.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    path = args.path or ("engine" if args.model == "shipped" else "step")
    if path == "engine" and args.model != "shipped":
        raise SystemExit("--path engine runs the shipped pair only (the 8B shape has no trained weights)")
    args.windows = args.windows or ("64" if path == "engine" else "512,4096")
    if path == "engine":
        rows = engine_rows(args, device, getattr(torch, args.dtype))
    else:
        rows = step_rows(args, device)
    out = {"command": "nwor-lab bench ring " + " ".join(argv if argv is not None else sys.argv[1:]),
           "device": device_name(device),
           "torch": torch.__version__, "path": path, "model": args.model, "k": args.k,
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "results": rows}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    save_json(out, args.out)
    return out


if __name__ == "__main__":
    main()
