"""Is a tree worth it? An EAGLE-2 dynamic tree against a chain at the same verify size, on the shipped pair.

    python -m nwor_lab.bench.tree_chain [--sizes 4,8,16] [--new-tokens 32]

For each verify size N (nodes the target verifies besides t_last) both drafters run through the same
loop, greedy, over the shipped prompts (`bench.tree.PROMPTS`), without the engine:
    chain  topk = 1, depth = N: the head's N best-next guesses one after another (what the engine runs)
    tree   EAGLE-2: topk children per expanded node, `depth` levels, the N best of the pool by
           cumulative draft log-probability; twice per N: the deep tree (topk 4, depth N, as deep as the
           chain) and EAGLE-2's usual depth-capped shape (`CAPPED[N]`, e.g. topk 2, depth 3 at N = 4)
One step: prefill the sequence so far (target and head layers), draft with the head
(`draft_tree_with_head`, its provisional K/V staged), verify the N nodes with the target (tree
attention, `stage`), greedy tree acceptance, emit the path + the bonus. Every emitted token is
checked against target-only greedy decoding (`equals_target_only`).

Per drafter: `mean_acceptance_length` (tokens emitted per verify step: accepted nodes + the bonus, the
lab's usual meaning), `mean_accepted` (nodes only), `steps`, and `draft_rows_per_step` (rows the head
runs per step: a chain N - 1, a tree (depth - 1) x topk): what the extra branches cost the drafter.
Verify rows are N + 1 per request in both, by construction.
"""
from __future__ import annotations

import json
import sys
import time

import torch

from nwor_lab.bench.tree import PROMPTS, draft_trees, encode_prompts, prefill, target_only_greedy
from nwor_lab.bench.tree_step import TreeBatch, TreeStep


@torch.no_grad()
def decode(target, head, prompts: list[list[int]], new_tokens: int, topk: int, depth: int, nodes: int,
           greedy: list[list[int]]) -> dict:
    """Greedy speculative decoding of every prompt (batched) with a drafted tree of (topk, depth, nodes).
    greedy[r]: target-only's tokens after prompt r (at least new_tokens). -> per-step accepted lengths."""
    seqs = [list(p) for p in prompts]
    out = [[] for _ in prompts]
    accepted, ok = [], True
    while True:
        live = [r for r in range(len(prompts)) if len(out[r]) < new_tokens]
        if not live:
            break
        cache, tables, ctx, g_root = prefill(target, head, [seqs[r] for r in live], 4, 2 + max(nodes, depth * topk))
        parents, tokens = draft_trees(head, cache, tables, ctx, g_root, topk, depth, nodes)
        step = TreeStep(target, cache, tables, TreeBatch(parents, tokens, [seqs[r][-1] for r in live], ctx),
                        "stage", attention="torch")
        verdict, acc = step.step()
        sampled = verdict.sampled.tolist()
        for i, (r, a) in enumerate(zip(live, acc.accepted_per_request())):
            emitted = sampled[i][:a + 1]
            ok &= emitted == greedy[r][len(out[r]):len(out[r]) + a + 1]
            out[r] += emitted
            # the last emitted token is the next step's t_last: the prefix ends before it
            seqs[r] += emitted
            accepted.append(a)
    return {"accepted": accepted, "equals_target_only": bool(ok)}


# Depth-capped EAGLE-2 shapes per verify size N: (topk, depth), the trees `bench tree_engine` runs
# through the engine. Beside them each size runs the deep tree (topk 4, depth N: as deep as the chain).
CAPPED = {4: (2, 3), 8: (2, 4), 16: (4, 5), 32: (4, 6), 64: (8, 6)}


def tree_shapes(n: int, topk: int = 4, depth: int | None = None) -> list[tuple[int, int]]:
    """The trees compared with the chain at verify size n: (topk, depth) each, deep first, no duplicates."""
    shapes = [(topk, min(depth or n, n))]
    if n in CAPPED and CAPPED[n] not in shapes:
        shapes.append(CAPPED[n])
    return shapes


def tree_vs_chain(sizes=(4, 8, 16), topk: int = 4, depth: int | None = None, new_tokens: int = 32,
                  prompts=PROMPTS, pair=None, capped: bool = True) -> dict:
    """The comparison of the module doc, per verify size N: the chain (topk 1, depth N), the deep tree
    (topk, depth N, or `depth`: as deep as the chain, so it can grow the chain itself when the head is
    confident) and, with `capped`, EAGLE-2's depth-capped shape (`CAPPED[N]`). pair: (target, head,
    tokenizer) loaded. -> {"rows": [one per drafter x size], "winner": {N: the drafter with the longest
    acceptance ("chain" or "tree topk=K,depth=D"; "tie" when they are equal)}, ...}."""
    if pair is None:
        from nwor_lab.model.shipped import load_tiny
        pair = load_tiny()
    target, head, tok = pair
    target, head = target.eval(), head.eval()
    ids = encode_prompts(tok, prompts)
    greedy = [target_only_greedy(target, p, new_tokens + max(sizes) + 1) for p in ids]
    rows, winner = [], {}
    for n in sizes:
        shapes = [("chain", 1, n)] + [(f"tree topk={k},depth={d}", k, d)
                                      for k, d in tree_shapes(n, topk, depth)[:None if capped else 1]]
        best, best_len = [], -1.0
        for name, k, dd in shapes:
            res = decode(target, head, ids, new_tokens, k, dd, n, greedy)
            a = res["accepted"]
            row = {"drafter": "chain" if k == 1 else "tree", "shape": name, "nodes": n, "topk": k, "depth": dd,
                   "prompts": len(ids), "new_tokens": new_tokens, "steps": len(a),
                   "mean_accepted": round(sum(a) / len(a), 3),
                   "mean_acceptance_length": round(sum(a) / len(a) + 1, 3),
                   "draft_rows_per_step": (dd - 1) * k, "verify_rows_per_step": n + 1,
                   "equals_target_only": res["equals_target_only"]}
            rows.append(row)
            if row["mean_acceptance_length"] > best_len:
                best, best_len = [name], row["mean_acceptance_length"]
            elif row["mean_acceptance_length"] == best_len:
                best.append(name)
        winner[n] = best[0] if len(best) == 1 else "tie: " + " = ".join(best)
    return {"rows": rows, "winner": winner, "pair": "shipped (tiny Llama + EAGLE-1 head)", "greedy": True}


def main(argv=None) -> int:
    from nwor_lab.commandline import args as types
    from nwor_lab.commandline.errors import LabArgumentParser
    p = LabArgumentParser(prog="python -m nwor_lab.bench.tree_chain", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=types.listed(types.integer(1, 64), "verify sizes"), default=(4, 8, 16))
    p.add_argument("--topk", type=types.integer(1, 16), default=4)
    p.add_argument("--depth", type=types.integer(1, 64), default=None)
    p.add_argument("--new-tokens", type=types.integer(1, 512), default=32)
    p.add_argument("--no-capped", action="store_true", help="leave out EAGLE-2's depth-capped trees")
    p.add_argument("--out", type=types.output_file, help="also write the JSON here")
    args = p.parse_args(argv)
    result = tree_vs_chain(args.sizes, args.topk, args.depth, args.new_tokens, capped=not args.no_capped)
    result.update(command="python -m nwor_lab.bench.tree_chain " + " ".join(sys.argv[1:] if argv is None else argv),
                  device="cpu", torch=torch.__version__, date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    text = json.dumps(result, indent=1)
    if args.out:
        from nwor_lab import atomic
        atomic.write_text(args.out, text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
