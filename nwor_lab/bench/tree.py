"""Tree windows, strategy by strategy, without the engine: one JSON row per strategy x tree shape.

    python -m nwor_lab.bench.tree [--nodes 8 16 32] [--topk 4] [--block-size 16] [--seed 0]

For each shape the toy pair (nwor_lab.model.toy) drafts an EAGLE-2 tree with its head (HeadTreeStep),
the target verifies it with tree attention, greedy tree acceptance picks the path, and each strategy
commits it: write-all + move (`off`), write-all + remap (block size 1), `cow`, `stage`. A row gives
`rows_written_per_token`, `bytes_moved`, `rejected_bytes_in_blocks` (policies.tree.tree_commit_costs),
`accepted_len`, `commit_us` (host wall time of the commit on this machine: CPU, the torch reference),
and `equals_target_only`: the emitted tokens equal target-only greedy decoding AND the cache holds
the path's K/V at n .. n + a as a target-only pass writes them. No tokens/s: that needs the engine.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time

import torch

from nwor_lab.config import LabConfig
from nwor_lab.kv import KVCacheSpec, PagedKVCache
from nwor_lab.model.attention import AttentionMetadata
from nwor_lab.model.toy import toy_config, toy_pair
from nwor_lab.model.tree_draft import draft_tree_with_head
from nwor_lab.policies import make_policy
from nwor_lab.policies.tree import STRATEGIES, RemapPolicy, tree_commit_costs
from nwor_lab.speculative.tree_accept import accept_tree_greedy
from nwor_lab.tree import TreeWindow

VOCAB = 64


@torch.no_grad()
def run_shape(strategy: str, topk: int, depth: int, nodes: int, block_size: int, seed: int) -> dict:
    target, head = toy_pair(seed, noise=0.15, cfg=toy_config(vocab_size=VOCAB))
    bs = 1 if strategy == "remap" else block_size
    L = target.num_layers + 1
    spec = KVCacheSpec(L, -(-512 // bs), bs, target.config.num_key_value_heads, target.config.head_dim)
    cache = PagedKVCache(spec)
    table = [list(range(spec.num_blocks))]
    rng = random.Random(seed)
    prompt = [rng.randrange(VOCAB) for _ in range(24)]
    n = len(prompt) - 1
    # prefill prompt[:-1] (target and head layers), then the head's output at t_last's row
    md = AttentionMetadata.build(cache, None, list(range(len(prompt))), [len(prompt)], table, [0], attention="torch")
    hidden = target(torch.tensor(prompt), md)
    greedy = [int(target.compute_logits(hidden[-1]).argmax())]
    # row n - 1 reads (t_last, h_{n-1}): its output proposes the token after t_last (d_1)
    g = head(torch.tensor(prompt[1:] + greedy), hidden, md)[-2:-1]
    cfg = LabConfig(nwor_mode="off" if strategy in ("move", "remap") else strategy, attention="torch")
    make = (lambda c: RemapPolicy(c, cfg)) if strategy == "remap" else (lambda c: make_policy(cfg, c))
    head_policy = make_policy(cfg.replace(nwor_mode="stage"), cache)
    # the head's committed rows are positions < n; the tree's depth-1 nodes run at position n
    tree, _ = draft_tree_with_head(head, cache, head_policy, g, [n], table, topk=topk, depth=depth,
                                   num_nodes=nodes)
    tables = torch.tensor(table, dtype=torch.int32)
    w = TreeWindow.build([tree.parents[0].tolist()], tables, [n], bs, tree.tokens[0])
    policy = make(cache)
    policy.begin(w, layers=range(target.num_layers), kind="verify")
    md = AttentionMetadata.build(cache, policy, n + w.token_depth.long(), [w.num_tokens], table, [n],
                                 attention="torch", slot_mapping=w.slot_mapping, tree_mask=w.ancestors)
    verdict = accept_tree_greedy(w, target.compute_logits(target(torch.tensor([prompt[-1]] + tree.tokens[0].tolist()),
                                                                 md)))
    acc = verdict.acceptance(w)
    t0 = time.perf_counter()
    policy.commit(acc)
    commit_us = (time.perf_counter() - t0) * 1e6
    if strategy == "remap":
        table = [policy.remap(tables, torch.tensor([n]))[0][0].tolist()]
    a = int(verdict.accepted_len[0])
    emitted = verdict.sampled[0, :a + 1].tolist()
    # target-only: greedy tokens and the K/V a plain pass writes at n .. n + a
    seq = prompt[:]
    for _ in range(a):
        seq.append(int(target.compute_logits(target.forward_dense(torch.tensor([seq]))[0, -1]).argmax()))
    want = seq[len(prompt):] + [int(target.compute_logits(target.forward_dense(torch.tensor([seq]))[0, -1]).argmax())]
    ref = PagedKVCache(spec)
    ref_table = [list(range(spec.num_blocks))]
    target(torch.tensor(seq), AttentionMetadata.build(ref, None, list(range(len(seq))), [len(seq)], ref_table, [0],
                                                      attention="torch"))
    same_kv = all(torch.allclose(cache.key[:target.num_layers, table[0][p // bs], p % bs],
                                 ref.key[:target.num_layers, p // bs, p % bs], atol=1e-5)
                  for p in range(n, n + a + 1))
    costs = tree_commit_costs(strategy, w, acc, num_layers=target.num_layers,
                              bytes_per_row=spec.bytes_per_token_layer, block_size=bs, context_lens=[n])
    return {**costs, "accepted_len": a, "topk": topk, "depth": depth, "block_size": bs,
            "commit_us": round(commit_us, 1), "equals_target_only": emitted == want and same_kv,
            "device": "cpu", "backend": "torch reference"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nwor_lab.bench.tree", description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for nodes in args.nodes:
        depth = max(2, -(-nodes // args.topk))
        for strategy in STRATEGIES:
            row = run_shape(strategy, args.topk, depth, nodes, args.block_size, args.seed)
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
