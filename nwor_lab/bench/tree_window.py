"""The one tree window `bench tree` cannot take from the engine: write-all + remap at block size 1.

The engine commits tree windows under the registered write policies (`off` = write-all + move,
`cow`, `stage`); `RemapPolicy` is no `nwor_mode`, since the engine would have to apply the block
table its commit returns (policies/tree.py). So remap is measured the way `bench policies`
measures chain windows: one window driven through the policy with a stand-in for the projection
(a copy of fixed K/V rows per layer), no model, on a block-size-1 cache. Beside it write-all + move
runs the very same window on the same cache, so the two commits compare like for like:

    window_ms         begin -> per layer (copy + write) -> commit (-> remap), median
    commit_ms         the commit alone (remap: its commit plus `remap`, the table re-pointed)
    exact_compaction  after each strategy's commit, positions n .. n + a (read through the re-pointed
                      table for remap) hold exactly the rows written for t_last and the path's nodes

Host clock, the device synchronised around each timed part (CUDA: the window runs eagerly; the
remap's table comes back as host lists, which a CUDA graph cannot hold).
"""
from __future__ import annotations

import statistics
import time

import torch

from nwor_lab.config import LabConfig
from nwor_lab.kv import KVCacheSpec, PagedKVCache
from nwor_lab.policies.tree import RemapPolicy, tree_policy
from nwor_lab.speculative.tree_window import TreeWindow
from nwor_lab.window import Acceptance


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def remap_window_times(parents: list[list[int]], draft_mask: list[bool], *, num_layers: int, kv_heads: int,
                       head_dim: int, dtype: torch.dtype, device, reps: int = 5, seed: int = 0) -> dict:
    """Time one tree window (`parents` per request, the accepted `draft_mask` [sum N_r]) under
    write-all + remap and write-all + move on one block-size-1 cache of `num_layers` x `kv_heads` x
    `head_dim`. -> {strategy: {"window_ms", "commit_ms"}} (medians of `reps`, round-robin)."""
    device = torch.device(device)
    rows = sum(1 + len(p) for p in parents)
    per = rows + 2                                 # one block a position: t_last + N nodes, a spare
    spec = KVCacheSpec(num_layers, per * len(parents), 1, kv_heads, head_dim, dtype=dtype)
    cache = PagedKVCache(spec, device)
    tables = torch.arange(per * len(parents), dtype=torch.int32, device=device).view(len(parents), per)
    ctx = torch.ones(len(parents), dtype=torch.long, device=device)    # t_last at position 1 of each table
    window = TreeWindow.build(parents, tables, ctx.tolist(), 1)
    mask = torch.tensor(draft_mask, dtype=torch.bool, device=device)
    acceptance = Acceptance.from_draft_mask(window, mask)
    gen = torch.Generator(device).manual_seed(seed)
    key = torch.randn(num_layers, rows, kv_heads, head_dim, generator=gen, device=device).to(dtype)
    scratch = torch.empty_like(key[0]), torch.empty_like(key[0])
    policies = {s: tree_policy(s, cache, LabConfig(validate=False), records=False) for s in ("remap", "move")}

    def window_then_commit(policy) -> tuple[float, float]:
        _sync(device)
        t0 = time.perf_counter()
        policy.begin(window)
        for layer in range(num_layers):
            k_out, v_out = policy.kv_destination(layer, 0, rows) or scratch
            k_out.copy_(key[layer]), v_out.copy_(key[layer])          # "the projection"
            policy.write(layer, k_out, v_out)
        _sync(device)
        t1 = time.perf_counter()
        policy.commit(acceptance)
        if isinstance(policy, RemapPolicy):                          # its commit leaves the table to re-point
            policy.remap(tables, ctx)
        _sync(device)
        t2 = time.perf_counter()
        return 1e3 * (t2 - t0), 1e3 * (t2 - t1)

    # the rows of t_last and the accepted path, by depth: what positions n .. n + a must hold after commit
    want, pos, offset = [], [], 0
    for r, p in enumerate(parents):
        path = [i + 1 for i in range(len(p)) if draft_mask[offset + i]]
        depth = {0: 0}
        for i, q in enumerate(p):
            depth[i + 1] = depth[q] + 1
        path.sort(key=depth.get)
        base = sum(1 + len(x) for x in parents[:r])
        want += [base] + [base + i for i in path]
        pos += [(r, 1 + d) for d in range(1 + len(path))]
        offset += len(p)
    exact = {}

    def compacted(strategy) -> bool:
        table = policies[strategy].remap(tables, ctx)[0] if strategy == "remap" else tables
        table = torch.as_tensor(table, device=device).long()
        slots = torch.stack([table[r, q] for r, q in pos])       # block size 1: a block is a slot
        return bool(torch.equal(cache.key[:, slots, 0], key[:, want]))

    times = {s: [] for s in policies}
    for rep in range(reps + 1):                    # the first round warms up, untimed
        for s, policy in policies.items():
            t = window_then_commit(policy)
            if rep:
                times[s].append(t)
            else:
                exact[s] = compacted(s)
    return {s: {"window_ms": round(statistics.median(w for w, _ in t), 4),
                "commit_ms": round(statistics.median(c for _, c in t), 4), "exact_compaction": exact[s]}
            for s, t in times.items()}
