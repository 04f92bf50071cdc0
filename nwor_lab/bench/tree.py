"""Tree windows, strategy by strategy: one JSON row per strategy x shape (`nwor-lab bench tree --json`).

    nwor-lab bench tree --json                          the shipped pair on CPU (default)
    nwor-lab bench tree --model 8b --json --out f.json  the Llama-3-8B shape on a GPU (N 16/32/64, batch 1/8/32)

Strategies (policies/tree.py): write-all + move (`off`: all N nodes written at n + 1 .. n + N, the path
copied to n + 1 .. n + a), write-all + remap (block size 1: the table re-pointed at the path's slots,
SGLang at page size 1), `cow` (log the N slots, restore, move), `stage` (nodes in the staging buffer,
the path committed to n + 1 .. n + a in one launch).

shipped  the tiny trained pair (float32, CPU by default). Each of `PROMPTS` (below) is prefilled;
         the EAGLE-1 head drafts an EAGLE-2 dynamic tree (`draft_tree_with_head`: topk, depth, nodes);
         the target verifies all prompts' trees in one window (batch = 8) with tree attention; greedy tree
         acceptance picks each path. `equals_target_only`: the emitted tokens (path + bonus) equal
         target-only greedy decoding, the cache holds exactly the verify pass's path rows at
         n .. n + a, and those equal a plain target-only pass of the same tokens (within 1e-5).
8b       random weights (`model.shapes`, bf16), a random prefix of `--context` tokens in the cache,
         trees of EAGLE-2's shape drawn from random draft log-probs, acceptance forced along the
         best-first path to `--accepted` nodes (random weights accept nothing). `equals_target_only`:
         the exact compaction, and the committed rows within `kv_tolerance` of a plain target-only
         pass: 3e-2 of the largest value, or target-only's own noise if larger (`target_only_noise`:
         its rows from the Triton kernel against the torch reference attention; bf16 through 32
         random layers: a tree and a chain sum the same keys in another order).
Per row: `rows_written_per_token` (cache rows written per layer per emitted token: write-all N + 1
plus moves, stage 1), `bytes_moved` (inside the cache, all layers), `stranded_bytes` (rejected rows
left in the block that holds the path's end, all layers), `step_ms` (eager verify + commit, host work
included, median; CUDA events on a GPU), `commit_ms` and `commit_share`, `tokens_per_s` (emitted
tokens / step time: the verify step alone; drafting is the same in every strategy and left out).
`--graphs` (CUDA) adds `graph_step_ms`: the step captured in one CUDA graph and replayed, the strategies'
graphs round-robin (or why not);
the summary then also compares stage with write-all + move on the replayed steps (no host time).
`--profile` (CUDA) adds `kernels`: the step's top CUDA kernels by time (torch.profiler), to say where
one strategy's step differs from another's; with `--graphs` from the strategies' graphs replayed in
turn (`bench.graph_profile`), else (and for a step no graph holds) from eager steps, one strategy
after the other (`kernels_from` says which).
"""
from __future__ import annotations

import json
import sys
import time

import torch

from nwor_lab import atomic
from nwor_lab.bench.ratios import step_ratio
from nwor_lab.bench.tree_step import (TreeBatch, TreeStep, contiguous_tables, first_child_path,
                                      graph_steps_ms, kernel_profile, new_cache, time_steps)
from nwor_lab.commandline import args as types
from nwor_lab.commandline.errors import LabArgumentParser, UsageError
from nwor_lab.policies.tree import STRATEGIES, STRATEGY_TITLES, TREE_STRATEGIES, tree_commit_costs

PROMPTS = ("def parse_args(argv):", "import os\n", "class Config:\n    def __init__(self,", "for i in range(",
           "def main():", "    return self.", "with open(path) as f:", "if __name__ == ")


# -- the shipped pair: real trees from the EAGLE head -----------------------------------------------
@torch.no_grad()
def prefill(target, head, prompts: list[list[int]], block_size: int, room: int, attention: str = "torch"):
    """Prefill every prompt (target layers, and the head's layer when `head`) in one pass.
    -> (cache, tables, context_lens n_r = len - 1, g_root [R, h] the head's output at t_last's row or None).
    `room`: positions each request needs past its prompt (the draft and verify windows' write-all rows)."""
    from nwor_lab.model.attention import AttentionMetadata
    lens = [len(p) for p in prompts]
    per = -(-(max(lens) + room) // block_size)
    cache = new_cache(target, per * len(prompts), block_size, extra_layers=1 if head is not None else 0)
    tables = contiguous_tables(len(prompts), per)
    md = AttentionMetadata.build(cache, None, [j for n in lens for j in range(n)], lens, tables, [0] * len(lens),
                                 attention=attention)
    dev = cache.device
    hidden = target(torch.tensor(sum(prompts, []), device=dev), md)
    if head is None:
        return cache, tables, [n - 1 for n in lens], None
    ends = torch.tensor(lens, device=dev).cumsum(0) - 1
    greedy = target.compute_logits(hidden[ends]).argmax(-1).tolist()
    # head row i reads (token i + 1, h_i): the row before t_last's proposes the token after t_last
    shifted = sum((p[1:] + [g] for p, g in zip(prompts, greedy)), [])
    g = head(torch.tensor(shifted, device=dev), hidden, md)
    return cache, tables, [n - 1 for n in lens], g[ends - 1]


@torch.no_grad()
def draft_trees(head, cache, tables, context_lens, g_root, topk: int, depth: int, nodes: int,
                attention: str = "torch"):
    """EAGLE-2 trees from the head (its provisional K/V staged: the cache is untouched).
    -> (parents [R] lists, tokens [R] lists)."""
    from nwor_lab.config import LabConfig
    from nwor_lab.model.tree_draft import draft_tree_with_head
    from nwor_lab.policies import make_policy
    policy = make_policy(LabConfig(nwor_mode="stage", attention=attention), cache, records=False)
    tree, _ = draft_tree_with_head(head, cache, policy, g_root, context_lens, tables, topk=topk, depth=depth,
                                   num_nodes=nodes, attention=attention)
    return tree.parents.tolist(), tree.tokens.tolist()


@torch.no_grad()
def target_only_greedy(target, prompt: list[int], n: int) -> list[int]:
    """The first `n` tokens greedy target-only decoding emits after `prompt` (dense passes)."""
    seq = list(prompt)
    dev = next(target.parameters()).device
    for _ in range(n):
        h = target.forward_dense(torch.tensor([seq], device=dev))[0, -1]
        seq.append(int(target.compute_logits(h).argmax()))
    return seq[len(prompt):]


def encode_prompts(tokenizer, prompts) -> list[list[int]]:
    out = [tokenizer.encode(p).ids for p in prompts]
    short = [p for p, ids in zip(prompts, out) if len(ids) < 2]
    if short:
        raise ValueError(f"prompts: {short!r} encode to fewer than 2 tokens; the head's root needs the row "
                         f"before t_last")
    return out


@torch.no_grad()
def shipped_rows(nodes=(8, 16, 32), topk: int = 4, depth: int = 6, block_size: int = 16, prompts=PROMPTS,
                 reps: int = 5, device: str = "cpu", strategies=STRATEGIES, pair=None) -> list[dict]:
    """`bench tree` on the shipped pair: one row per strategy x node count (module doc). `pair`:
    (target, head, tokenizer) already loaded."""
    if pair is None:
        from nwor_lab.model.shipped import load_tiny
        pair = load_tiny(device=device)
    target, head, tok = pair
    target, head = target.eval(), head.eval()
    ids = encode_prompts(tok, prompts)
    room = 2 + max(max(nodes), depth * topk)
    bases = {bs: prefill(target, head if bs == block_size else None, ids, bs, room)
             for bs in {block_size, 1 if any(TREE_STRATEGIES[s].block_size_one for s in strategies) else block_size}}
    cache, tables, ctx, g_root = bases[block_size]
    greedy = {}
    rows = []
    for n_nodes in nodes:
        parents, tokens = draft_trees(head, cache, tables, ctx, g_root, topk, depth, n_nodes)
        batch = TreeBatch(parents, tokens, [p[-1] for p in ids], ctx)
        steps, checks = {}, {}
        for s in strategies:
            bs = 1 if TREE_STRATEGIES[s].block_size_one else block_size
            base, tab, _, _ = bases[bs]
            steps[s] = TreeStep(target, base, tab, batch, s, attention="torch")
            checks[s] = steps[s].check(tol=1e-5)
        times = time_steps(steps, reps=reps, warmup=1)
        for s in strategies:
            c = checks[s]
            want = []
            for r, a in enumerate(c["accepted_len"]):
                key = (r, a)
                if key not in greedy:
                    greedy[key] = target_only_greedy(target, ids[r], a + 1)
                want.append(greedy[key])
            emitted = [t + [b] for t, b in zip(c["path_tokens"], c["bonus"])]
            rows.append(_row(steps[s], c, times[s], emitted == want, "shipped", topk, depth))
    return rows


# -- the 8B shape: random weights, forced paths -----------------------------------------------------
def synthetic_trees(num_reqs: int, topk: int, depth: int, nodes: int, seed: int, vocab: int = 64):
    """EAGLE-2 trees (speculative.tree_draft.dynamic_tree) over random draft log-probs: the shapes a
    drafter makes, without one. -> (parents, tokens) per request (tokens < `vocab`)."""
    from nwor_lab.speculative.tree_draft import dynamic_tree
    g = torch.Generator().manual_seed(seed)

    def step(tokens, parent_rows, level):
        return torch.log_softmax(3 * torch.randn(*tokens.shape, vocab, generator=g), -1)

    root = torch.log_softmax(3 * torch.randn(num_reqs, vocab, generator=g), -1)
    tree = dynamic_tree(step, root, topk, depth, nodes)
    return tree.parents.tolist(), tree.tokens.tolist()


@torch.no_grad()
def shape_rows(model: str = "8b", nodes=(16, 32, 64), batches=(1, 8, 32), topk: int = 4, depth: int = 6,
               block_size: int = 16, context: int = 1024, accepted: int = 3, reps: int = 10,
               device: str = "cuda", attention: str = "auto", strategies=STRATEGIES, graphs: bool = False,
               seed: int = 0, profile: bool = False, progress=None, target=None) -> list[dict]:
    """`bench tree` on a random-weight shape (`8b`, or `8b-mini` to run the same path small on CPU).
    target: a model of that shape already built (its device and dtype are used)."""
    from nwor_lab.model.shapes import random_target
    dtype = torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if target is None:
        target = random_target(model, device, dtype)
    target = target.eval()
    dtype = next(target.parameters()).dtype
    tol = 3e-2 if dtype != torch.float32 else 1e-4
    rows = []
    for batch in batches:
        for n_nodes in nodes:
            parents, tokens = synthetic_trees(batch, topk, depth, n_nodes, seed + 7 * batch + n_nodes)
            gen = torch.Generator().manual_seed(seed + batch)
            t_last = torch.randint(0, target.config.vocab_size, (batch,), generator=gen).tolist()
            tb = TreeBatch(parents, tokens, t_last, [context] * batch)
            forced = [first_child_path(p, accepted) for p in parents]
            steps, checks, bases, failed = {}, {}, {}, {}
            for s in strategies:
                bs = 1 if TREE_STRATEGIES[s].block_size_one else block_size
                per = -(-(context + n_nodes + 2) // bs)
                try:
                    if bs not in bases:                 # a random prefix, one layer at a time
                        bases[bs] = new_cache(target, per * batch, bs)
                        g = torch.Generator(bases[bs].device).manual_seed(seed)
                        for layer in range(bases[bs].spec.num_layers):
                            bases[bs].key[layer].normal_(generator=g)
                            bases[bs].value[layer].normal_(generator=g)
                    steps[s] = TreeStep(target, bases[bs], contiguous_tables(batch, per), tb, s, attention, forced)
                    # target-only's own noise, measured once a shape: every strategy commits the same path
                    # of the same tokens (remap's block-size-1 prefix is another draw of the same prefix
                    # distribution: a floor of the same size, not the same bits)
                    noise = next((c["target_only_noise"] for c in checks.values()), None)
                    checks[s] = steps[s].check(tol=tol, noise=noise)
                    steps[s].base = None             # the timed steps run on their own copies
                except Exception as e:  # noqa: BLE001 -- one strategy's failure is its row, the others still run
                    steps.pop(s, None)
                    failed[s] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
            del bases
            times = time_steps(steps, reps=reps) if steps else {}
            cuda = torch.device(device).type == "cuda"
            graphed = graph_steps_ms(steps, reps, profile=profile) if graphs and cuda and steps else {}
            for s in strategies:
                if s in failed:
                    row = {"strategy": STRATEGY_TITLES[s], "model": model, "nodes": n_nodes, "batch": batch,
                           "block_size": 1 if TREE_STRATEGIES[s].block_size_one else block_size, "error": failed[s],
                           "equals_target_only": None,
                           "device": torch.cuda.get_device_name() if torch.device(device).type == "cuda" else "cpu"}
                    rows.append(row)
                    if progress:
                        progress(row)
                    continue
                row = _row(steps[s], checks[s], times[s], True, model, topk, depth)
                row["context"] = context
                g = graphed.get(s, {})
                if g:
                    row["graph_step_ms"] = g["ms"]
                    if g.get("reps_ms"):
                        row["graph_step_ms_reps"] = g["reps_ms"]     # the strategies' repeat i back to back
                    if g["error"]:
                        row["graph_error"] = g["error"]
                if profile and cuda:     # from the graphs' interleaved replays where there are some, else eager
                    row["kernels"], row["kernels_from"] = (g["kernels"], "graph replays, interleaved") \
                        if g.get("kernels") else (kernel_profile(steps[s]), "eager steps")
                rows.append(row)
                if progress:
                    progress(row)
            del steps
            if torch.device(device).type == "cuda":
                torch.cuda.empty_cache()
    return rows


def _row(step: TreeStep, check: dict, timing, tokens_ok: bool, model: str, topk: int, depth: int) -> dict:
    spec = step.cache.spec
    L = step.layers
    acc = check["accepted_len"]
    w = step.window
    costs = tree_commit_costs(step.strategy, w, check["acceptance"], num_layers=L, bytes_per_row=spec.bytes_per_token_layer,
                              block_size=spec.block_size, context_lens=step.batch.context_lens)
    step_ms, commit_ms = timing
    emitted = sum(1 + a for a in acc)
    dev = step.cache.device
    return {"strategy": STRATEGY_TITLES[step.strategy], "model": model, "nodes": costs["nodes"], "batch": step.batch.num_reqs,
            "topk": topk, "depth": depth, "block_size": spec.block_size,
            "accepted_len": round(sum(acc) / len(acc), 3), "accepted_lens": acc,
            "rows_written_per_token": round(costs["rows_written_per_token"], 4),
            "bytes_moved": costs["bytes_moved"], "stranded_bytes": costs["rejected_bytes_in_blocks"],
            "step_ms": round(step_ms, 3), "commit_ms": round(commit_ms, 3),
            "commit_share": round(commit_ms / step_ms, 4) if step_ms else None,
            "tokens_per_s": round(emitted / (step_ms / 1e3), 1) if step_ms else None,
            "equals_target_only": bool(tokens_ok and check["exact_compaction"] and check["kv_equal"]),
            "exact_compaction": check["exact_compaction"], "kv_max_abs_err": check["kv_max_abs_err"],
            "kv_tolerance": check.get("kv_tolerance"), "target_only_noise": check.get("target_only_noise"),
            "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "dtype": str(spec.dtype).replace("torch.", "")}


def main(argv=None) -> int:
    p = LabArgumentParser(prog="nwor-lab bench tree", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--out", type=types.output_file, help="also write the JSON here")
    p.add_argument("--model", choices=("shipped", "8b", "8b-mini"), default="shipped",
                   help="shipped: the tiny trained pair, real trees (default, CPU); 8b: the Llama-3-8B shape "
                   "(CUDA), forced paths; 8b-mini: the 8b path at toy size")
    p.add_argument("--device", type=types.device, default=None, help="default: cpu for shipped, cuda for 8b")
    p.add_argument("--nodes", type=types.listed(types.integer(1, 512), "node counts"), default=None,
                   help="nodes per tree (default: 8,16,32 shipped; 16,32,64 8b)")
    p.add_argument("--batches", type=types.listed(types.integer(1, 4096), "batch sizes"), default=(1, 8, 32),
                   help="requests per window (8b; shipped: one request per prompt)")
    p.add_argument("--topk", type=types.integer(1, 64), default=4, help="EAGLE-2: children per expanded node")
    p.add_argument("--depth", type=types.integer(1, 64), default=6, help="EAGLE-2: expansion levels")
    p.add_argument("--block-size", type=types.integer(1, 1024), default=16)
    p.add_argument("--context", type=types.integer(1, 1 << 20), default=1024, help="8b: cached tokens a request")
    p.add_argument("--accepted", type=types.integer(0, 64), default=3, help="8b: forced accepted nodes a request")
    p.add_argument("--strategies", type=types.listed(types.one_of(STRATEGIES), "strategies"), default=STRATEGIES)
    p.add_argument("--reps", type=types.integer(1, 1000), default=None, help="timed steps per strategy (median)")
    p.add_argument("--attention", default="auto", choices=["auto", "triton", "torch"])
    p.add_argument("--graphs", action="store_true", help="CUDA: also time the step replayed from one CUDA graph")
    p.add_argument("--profile", action="store_true", help="CUDA: also list each step's top kernels by time")
    args = p.parse_args(argv)
    device = args.device or ("cpu" if args.model in ("shipped", "8b-mini") else "cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UsageError(f"bench tree --model {args.model}: needs a CUDA device (none is visible here); run it on a "
                         f"GPU machine, or use --model shipped / 8b-mini on CPU")
    for n in args.nodes or ():
        most = args.topk + (args.depth - 1) * args.topk ** 2
        if n > most:
            raise UsageError(f"--nodes {n}: a tree of --topk {args.topk} and --depth {args.depth} proposes at most "
                             f"{most} nodes; lower --nodes or raise --depth / --topk")
    t0 = time.time()
    progress = lambda row: print(json.dumps(row), file=sys.stderr, flush=True)   # noqa: E731
    if args.model == "shipped":
        rows = shipped_rows(args.nodes or (8, 16, 32), args.topk, args.depth, args.block_size, reps=args.reps or 5,
                            device=device, strategies=args.strategies)
    else:
        rows = shape_rows(args.model, args.nodes or (16, 32, 64), args.batches, args.topk, args.depth,
                          args.block_size, args.context, args.accepted, args.reps or 10, device, args.attention,
                          args.strategies, args.graphs, profile=args.profile,
                          progress=progress)
    result = {"bench": "tree", "model": args.model, "device": rows[0]["device"] if rows else device,
              "torch": torch.__version__, "command": "nwor-lab bench tree " + " ".join(argv or sys.argv[1:]),
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": round(time.time() - t0, 1),
              "summary": stage_vs_move(rows), "rows": rows}
    text = json.dumps(result, indent=1)
    if args.out:
        atomic.write_text(args.out, text + "\n")
    if args.json:
        print(text)
    else:
        for r in rows:
            if "error" in r:
                print(f"{r['strategy']:>16} N={r['nodes']:>3} batch={r['batch']:>3} FAILED: {r['error']}")
                continue
            print(f"{r['strategy']:>16} N={r['nodes']:>3} batch={r['batch']:>3} bs={r['block_size']:>2} "
                  f"a={r['accepted_len']:.2f} rows/token={r['rows_written_per_token']:.2f} moved={r['bytes_moved']} "
                  f"stranded={r['stranded_bytes']} step={r['step_ms']:.2f} ms commit={r['commit_share']:.1%} "
                  f"ok={r['equals_target_only']}")
    return 0


def stage_vs_move(rows: list[dict]) -> dict:
    """Per (nodes, batch): stage's step time over write-all + move's, and whether stage is no slower;
    from the eager steps (`step_ms`) and, where both were captured, the replayed ones: the median of the
    per-repeat ratios where both rows have their repeats (`graph_step_ms_reps`, taken back to back: the
    ratio of one repeat cancels what drifts between repeats), else the ratio of the medians."""
    out = {}
    for key, name, verdict in (("step_ms", "stage_over_move_step", "stage_no_slower_everywhere"),
                               ("graph_step_ms", "stage_over_move_graph_step", "stage_no_slower_everywhere_graphed")):
        by = {}
        for r in rows:
            if r.get(key) is not None:
                by.setdefault((r["nodes"], r["batch"]), {})[r["strategy"]] = r
        ratios = {f"N{n}_b{b}": round(step_ratio(t["stage"], t["write-all+move"], key), 4)
                  for (n, b), t in sorted(by.items()) if "stage" in t and "write-all+move" in t}
        if ratios or key == "step_ms":
            out[name] = ratios
            out[verdict] = all(v <= 1.0 for v in ratios.values()) if ratios else None
    return out



if __name__ == "__main__":
    sys.exit(main())
