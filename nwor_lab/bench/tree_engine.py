"""Benchmark (not a test): is a draft tree worth it? A tree against a chain at the same verify size
(N + 1 rows a request: t_last and N nodes, or t_last and k = N drafts), through the engine.

    python -m nwor_lab.bench.tree_engine cpu --nodes 4,8 --out tree_vs_chain_cpu.json
        the shipped pair (real acceptance): per N, the chain k = N, the chain k = 4 (the usual
        one), and the tree of `DEFAULT_TREES[N]`, under each write policy: mean acceptance length,
        tokens/s, target forwards, equals target-only (greedy)
    python -m nwor_lab.bench.tree_engine profile --tree topk=4,depth=5,nodes=16
        a tree's forced-acceptance profile measured on the shipped pair (speculative.tree_forced's
        format: per-depth reach rates and sibling ranks of the accepted nodes); `--k N` for a chain
    python -m nwor_lab.bench.tree_engine 8b --nodes 16,32,64 --batch-sizes 1,8,32 --out tree8b.json
        the Llama-3-8B shape with random weights (nwor_lab.bench.engine8b's), acceptance forced from
        the profiles measured first on the shipped pair with the same tree shape and the same chain
        (measured in the same run, on the same device): tree vs chain, stage vs off, each replayed
        from CUDA graphs (`cuda_graph`, `graphed_steps` in each row; `--eager` adds eager rows).

Timings are wall-clock seconds of whole runs (median of `--repeats` after a cold run); the JSON
names the device. Numbers are this machine's: nothing here asserts a speed.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

import torch

from nwor_lab.bench.output import save_json
from nwor_lab.bench.timing import device_name, free_device
from nwor_lab.config import LabConfig, parse_tree
from nwor_lab.engine.tree_plan import tree_plan

# verify size N -> the tree of N nodes benchmarked against the chain k = N (EAGLE-2 shapes)
DEFAULT_TREES = {4: "topk=2,depth=3,nodes=4", 8: "topk=2,depth=4,nodes=8", 16: "topk=4,depth=5,nodes=16",
                 32: "topk=4,depth=6,nodes=32", 64: "topk=8,depth=6,nodes=64"}

# Written for this benchmark (held out: not in the shipped pair's training corpus).
PROMPTS = [
    "def merge_intervals(items):\n    \"\"\"Merge overlapping (start, end) pairs.\"\"\"\n",
    "class LRUCache:\n    def __init__(self, capacity):\n        self.capacity = capacity\n",
    "import json\n\n\ndef load_settings(path):\n    with open(path) as f:\n",
    "    for index, value in enumerate(values):\n        if value is None:\n",
]


def tree_for(n: int, spec: str | None = None) -> str:
    """The tree benchmarked at verify size n: `spec`, or DEFAULT_TREES[n] (canonical spelling)."""
    text = spec or DEFAULT_TREES.get(n)
    if text is None:
        raise ValueError(f"--nodes {n}: no default tree for {n} nodes (have {sorted(DEFAULT_TREES)}); give --tree")
    shape = parse_tree("--tree", text)
    if tree_plan(shape).nodes != n:
        raise ValueError(f"--tree {text!r} has {tree_plan(shape).nodes} nodes, not {n}")
    return shape.spelling


def profile_from_trace(trace, depth: int) -> dict:
    """A forced-acceptance profile from an engine's trace (speculative.tree_forced's format): over
    the verify windows with drafts whose output was not cut, p_d = the fraction whose accepted path
    reached depth d, ranks[d] = how often the accepted node at depth d was its parent's c-th child
    (chains: rank 0). Rates are made non-increasing (they are, up to the cut windows left out)."""
    reach, ranks, windows = [0] * depth, [[0] * 1 for _ in range(depth)], 0
    for w in trace:
        if w.kind != "verify":
            continue
        for i, (n, a, out) in enumerate(zip(w.drafted, w.accepted, w.emitted)):
            if not n or len(out) <= a:        # no drafts, or the request's last tokens were cut
                continue
            windows += 1
            path = w.path_ranks[i] if w.path_ranks is not None else [0] * a
            for d in range(min(a, depth)):
                reach[d] += 1
                r = path[d]
                if r >= len(ranks[d]):
                    ranks[d] += [0] * (r + 1 - len(ranks[d]))
                ranks[d][r] += 1
    profile, last = [], 1.0
    for c in reach:
        last = min(last, c / windows if windows else 0.0)
        profile.append(round(last, 4))
    rank_rows = [[round(x / sum(row), 4) for x in row] if sum(row) else [1.0] for row in ranks]
    for row in rank_rows:            # exact sums after rounding
        row[0] = round(1.0 - sum(row[1:]), 4)
    return {"kind": "tree", "profile": profile, "ranks": rank_rows, "seed": 0, "windows": windows}


def _pair(device, head: str):
    from nwor_lab.model import load_tiny
    return load_tiny(device=device, head=head)


def measure_profile(tree: str = "", k: int = 4, *, head: str = "eagle1", device="cpu", new_tokens: int = 64,
                    prompts=PROMPTS, pair=None) -> dict:
    """The profile of a tree (`tree`) or of the chain k (`tree` = "") on the shipped pair, greedy."""
    from nwor_lab.engine import generate
    t, h, tok = pair or _pair(device, head)
    cfg = LabConfig(nwor_mode="stage", tree=tree, cuda_graph=False)     # acceptance only: eager is enough
    res = generate(list(prompts), new_tokens, k=k, config=cfg, target=t, head=h, tokenizer=tok, device=device)
    depth = tree_plan(cfg.tree_shape).depth if tree else k
    out = profile_from_trace(res.trace, depth)
    out.update(kind="tree" if tree else "chain", tree=tree or None, k=None if tree else k, head=head, new_tokens=new_tokens, prompts=len(prompts),
               mean_acceptance_length=round(res.mean_acceptance_length, 4))
    return out


def _median(xs):
    s = sorted(xs)
    return s[len(s) // 2]


def tree_vs_chain(nodes=(4, 8), modes=("off", "stage"), *, head: str = "eagle1", device="cpu", new_tokens: int = 48,
                  repeats: int = 1, prompts=PROMPTS, trees: dict | None = None, usual_k: int = 4,
                  pair=None) -> list[dict]:
    """Rows per verify size N: chain k = N, chain k = `usual_k`, the tree of N nodes, each under every
    write policy in `modes`, on the shipped pair (greedy). Each row: kind, nodes (N, or k for the usual
    chain), verify_rows_per_request, nwor, mean_acceptance_length, tokens_per_s (median of `repeats`
    timed runs after a cold one), target_forwards, equals_target_only. `pair`: (target, head, tokenizer)
    already loaded (else the shipped pair with `head`)."""
    from nwor_lab.bench.timing import timed
    from nwor_lab.engine import generate
    dev = torch.device(device)
    t, h, tok = pair or _pair(dev, head)
    ref = generate(list(prompts), new_tokens, k=0, target=t, head=h, tokenizer=tok, device=dev).token_ids
    rows = []
    for n in nodes:
        spec = tree_for(n, (trees or {}).get(n))
        configs = [("chain", n, ""), ("tree", n, spec)] + ([("chain", usual_k, "")] if usual_k not in nodes else [])
        for kind, k, tree in configs:
            for mode in modes:
                cfg = LabConfig(nwor_mode=mode, tree=tree)
                def go():
                    return generate(list(prompts), new_tokens, k=k, config=cfg, target=t, head=h, tokenizer=tok,
                                    device=dev)
                res, _ = timed(go, dev)                   # cold
                times = []
                for _ in range(repeats):
                    res, secs = timed(go, dev)
                    times.append(secs)
                ntok = sum(len(o) for o in res.token_ids)
                row = {"kind": kind, "nodes": k, "tree": tree or None, "verify_rows_per_request": k + 1,
                       "head": head, "nwor": mode, "mean_acceptance_length": round(res.mean_acceptance_length, 4),
                       "acceptance_by_position": [round(a, 3) for a in res.acceptance_by_position],
                       "target_forwards": res.target_forwards, "tokens": ntok,
                       "seconds": round(_median(times), 4), "tokens_per_s": round(ntok / _median(times), 2),
                       "equals_target_only": res.token_ids == ref, "device": device_name(dev),
                       "compared_at_nodes": n}
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


# -- the 8B shape, forced acceptance ------------------------------------------------------------
def build_engine_8b(target, head, tree: str, k: int, mode: str, batch: int, prompt_len: int, new_tokens: int,
                    acceptance, attention: str, graphs: bool, scv: str = "graph", block_size: int | None = None):
    """engine8b.build_engine with a tree (`tree` non-empty: N nodes a window, drafted by the head);
    `block_size` defaults to engine8b's."""
    from nwor_lab.engine import SpecEngine
    from nwor_lab.engine.buffers import token_bucket
    from nwor_lab.bench.engine8b import BLOCK
    cfg = LabConfig(nwor_mode=mode, scv_mode=scv, attention=attention, cuda_graph=graphs, tree=tree)
    ahead = tree_plan(cfg.tree_shape).lookahead if tree else k + 1
    n = tree_plan(cfg.tree_shape).nodes if tree else k
    block = block_size or BLOCK
    per = -(-(prompt_len + new_tokens + ahead) // block)
    tokens = token_bucket(batch * max(prompt_len, n + 1) + prompt_len)
    return SpecEngine(target, head, cfg, k=k, num_blocks=per * (batch + 1) + 1, block_size=block,
                      max_num_seqs=batch, max_num_batched_tokens=tokens, acceptance=acceptance)


def main_8b(args, argv) -> dict:
    from nwor_lab.bench.engine8b import measure_interleaved, prompts_for
    from nwor_lab.engine.generate import acceptance_stats
    from nwor_lab.model.shapes import random_head, random_target
    from nwor_lab.speculative.synthetic import ForcedAcceptance
    from nwor_lab.speculative.tree_forced import TreeForcedAcceptance
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    t0 = time.perf_counter()
    # the profiles first, on the shipped pair, same device: the tree's and the chain k = N's
    pair = _pair(dev, "eagle1")
    profiles = {}
    for n in args.nodes:
        spec = tree_for(n)
        profiles[("tree", n)] = measure_profile(spec, head="eagle1", device=dev, pair=pair)
        profiles[("chain", n)] = measure_profile("", n, head="eagle1", device=dev, pair=pair)
        for key in (("tree", n), ("chain", n)):
            print(json.dumps({"profile_of": key[0], "nodes": n, **profiles[key]}), flush=True)
    del pair
    target = random_target(args.model, dev, getattr(torch, args.dtype))
    head = random_head(target, "eagle1", args.model)
    rows = []
    out = {}

    def write(complete):
        out.update({"command": "python -m nwor_lab.bench.tree_engine " + " ".join(argv), "device": device_name(dev),
                    "torch": torch.__version__, "model": args.model, "dtype": args.dtype,
                    "profiles": [{"nodes": n, **p} for (_, n), p in profiles.items()],
                    "prompts": f"random ids: {args.prompt_len}-token prompts, {args.new_tokens} new tokens each",
                    "complete": complete, "seconds_total": round(time.perf_counter() - t0, 1), "results": rows})
        save_json(out, args.out)
    for bs in args.batch_sizes:
        prompts = prompts_for(bs, args.prompt_len, target.config.vocab_size, False)
        for n in args.nodes:
            spec = tree_for(n)
            tprof, cprof = profiles[("tree", n)], profiles[("chain", n)]
            tree_acc = TreeForcedAcceptance.from_dict(tprof)
            chain_acc = ForcedAcceptance(tuple(cprof["profile"]))
            modes = (True, False) if args.eager else (True,)
            configs = [(kind, tree, g) for g in modes for kind, tree in (("tree", spec), ("chain", ""))]
            for kind, tree, graphs in configs:
                def error_row(mode, err, where):
                    row = {"batch_size": bs, "kind": kind, "nodes": n, "tree": tree or None, "nwor": mode,
                           "cuda_graph": bool(graphs and dev.type == "cuda"),
                           "error": f"{type(err).__name__}: {err}"[:2000],
                           "where": where[-3000:]}     # the stack: a GPU-only failure is read here
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                # every policy's engine built first, then their timed runs taken in turn (ABBA): one
                # policy's runs after the other's ordered off and stage by the clock, not the policy
                engines = {}
                for mode in args.policies:
                    try:
                        engines[mode] = build_engine_8b(target, head, tree, n, mode, bs, args.prompt_len,
                                                        args.new_tokens, tree_acc if tree else chain_acc,
                                                        args.attention, graphs)
                    except Exception as err:          # one failing config must not lose the others' rows
                        error_row(mode, err, traceback.format_exc())
                try:
                    runs = measure_interleaved(engines, prompts, args.new_tokens, args.repeats, dev) if engines else {}
                except Exception as err:
                    for mode in engines:
                        error_row(mode, err, traceback.format_exc())
                    runs = {}
                for mode, run in runs.items():
                    engine = engines[mode]
                    depth = tree_plan(engine.tree).depth if tree else n
                    mean, _ = acceptance_stats(run["trace"], depth)
                    reqs = run["requests"]
                    ntok = sum(len(r.output) for r in reqs)
                    secs = run["seconds"]
                    decode_secs = max(secs - run["prefill_seconds"], 1e-9)
                    steps = sum(1 for w in run["trace"] if w.kind == "verify" and "prefill" not in w.kinds)
                    steps //= max(1, len(run["times"]))
                    row = {"batch_size": bs, "kind": kind, "nodes": n, "tree": tree or None, "nwor": mode,
                           "cuda_graph": bool(graphs and dev.type == "cuda"),
                           "mean_acceptance_length": round(mean, 3),
                           "expected_mean_acceptance_length": round(1 + sum((tprof if tree else cprof)["profile"]), 3),
                           "tokens": ntok, "seconds": round(secs, 4), "tokens_per_s": round(ntok / secs, 2),
                           "decode_tokens_per_s": round((ntok - len(reqs)) / decode_secs, 2),
                           "decode_step_ms": round(1e3 * decode_secs / max(1, steps), 3),
                           "repeats": len(run["times"]),
                           f"seconds_over_{next(iter(runs))}": round(_median(run["paired"]), 4),
                           "graphed_steps": engine.runner.graphed_steps}
                    if dev.type == "cuda":
                        row["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                engines = runs = engine = None
                free_device(dev)
                write(False)
    write(True)
    return out


def _ints(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected ints >= 1, got {text!r}")
    return vals


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m nwor_lab.bench.tree_engine", description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("cpu", "profile", "8b"))
    p.add_argument("--nodes", type=_ints, default=None, help="verify sizes N (cpu: 4,8; 8b: 16,32,64)")
    p.add_argument("--tree", default="", help="profile: the tree (default: the chain --k)")
    p.add_argument("--k", type=int, default=4, help="profile: the chain's k when no --tree")
    p.add_argument("--head", choices=("eagle1", "eagle3"), default="eagle1")
    p.add_argument("--policies", default="off,stage", help="write policies, comma-separated")
    p.add_argument("--device", default=None)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--model", default="8b", help="8b: the shape (8b, or 8b-mini on CPU)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--batch-sizes", type=_ints, default=[1, 8, 32])
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--attention", default="auto")
    p.add_argument("--eager", action="store_true", help="8b: also every config with every step eager")
    p.add_argument("--out", default=None, help="also write the JSON here")
    return p


@torch.no_grad()
def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    args.policies = [m.strip() for m in args.policies.split(",") if m.strip()]
    if args.what == "profile":
        out = measure_profile(args.tree, args.k, head=args.head, device=args.device or "cpu",
                              new_tokens=args.new_tokens)
    elif args.what == "cpu":
        dev = args.device or "cpu"
        out = {"command": "python -m nwor_lab.bench.tree_engine " + " ".join(argv),
               "device": device_name(torch.device(dev)), "torch": torch.__version__,
               "results": tree_vs_chain(args.nodes or (4, 8), args.policies, head=args.head, device=dev,
                                        new_tokens=args.new_tokens, repeats=args.repeats)}
    else:
        args.nodes = args.nodes or [16, 32, 64]
        return main_8b(args, argv)
    save_json(out, args.out)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
