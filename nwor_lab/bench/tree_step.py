"""One tree verify step of the target under one commit strategy, checked and timed (`bench tree`'s core).

A step, for R requests whose trees are drafted already (`TreeBatch`):
    verify   policy.begin(window) -> target forward over [t_last, node_1 .. node_N] per request with tree
             attention (every layer writes its K/V through the policy) -> logits -> greedy tree acceptance
    commit   policy.commit(path): write-all + move, cow, stage, or write-all + remap (block size 1: the
             table re-pointed, `RemapPolicy.remap`)
The acceptance is the target's greedy verdict, or a forced path (`forced`: one root path per request,
the 8B shape's random weights accept nothing), the same in every strategy.

Checks (`TreeStep.check`, on a fresh copy of the cache, never on a timed one):
    exact_compaction     after commit the cache holds, at positions n .. n + a, exactly the bytes the
                         verify pass computed for t_last and the path's nodes (from the cache under
                         write-all, from the staging buffer under stage)
    kv_vs_target_only    max |committed - target-only| over those rows, all target layers, where
                         target-only is a plain chain pass of [t_last, path] at n .. n + a over the same
                         prefix (DirectWriter); within `tol` of the reference's largest value -> kv_equal
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from nwor_lab.config import LabConfig
from nwor_lab.kv import KVCacheSpec, PagedKVCache
from nwor_lab.model.attention import AttentionMetadata, use_kernel
from nwor_lab.policies.tree import RemapPolicy, tree_policy
from nwor_lab.speculative.tree_accept import accept_tree_greedy
from nwor_lab.tree import TreeWindow, depths_of
from nwor_lab.window import Acceptance


@dataclass
class TreeBatch:
    """R drafted trees: parents[r] (node i+1 -> 0 .. i), tokens[r] (one per node), t_last[r] (the token
    at position n), context_lens[r] = n (positions 0 .. n - 1 are in the cache)."""

    parents: list
    tokens: list
    t_last: list
    context_lens: list

    @property
    def num_reqs(self) -> int:
        return len(self.parents)


def first_child_path(parents: list[int], length: int) -> list[bool]:
    """A forced accepted path: from t_last, take the lowest-numbered child (EAGLE-2 numbers nodes in
    pool order, so the first child is the best-scored one) `length` times or until a leaf.
    -> [N] bool, True on the path's nodes."""
    mask, at = [False] * len(parents), 0
    for _ in range(length):
        child = next((i + 1 for i, p in enumerate(parents) if p == at), None)
        if child is None:
            break
        mask[child - 1], at = True, child
    return mask


def policy_for(strategy: str, cache: PagedKVCache, attention: str):
    """The write policy of one strategy (records off: a timed step has no host reads)."""
    return tree_policy(strategy, cache, LabConfig(attention=attention, validate=False), records=False)


def contiguous_tables(num_reqs: int, blocks_per_req: int) -> list[list[int]]:
    """Request r owns blocks r * per .. (r + 1) * per - 1: a position's slot is r * per * BS + p."""
    return [list(range(r * blocks_per_req, (r + 1) * blocks_per_req)) for r in range(num_reqs)]


def copy_cache(cache: PagedKVCache) -> PagedKVCache:
    out = PagedKVCache(cache.spec, cache.device)
    out.key.copy_(cache.key)
    out.value.copy_(cache.value)
    return out


def rows_at(cache: PagedKVCache, tables: torch.Tensor, req: list[int], pos: list[int], layers: int):
    """(key, value) `[layers, n, H, D]` of request req[i]'s position pos[i] through `tables`."""
    bs = cache.spec.block_size
    dev = cache.device
    r = torch.tensor(req, device=dev)
    p = torch.tensor(pos, device=dev)
    blocks = tables.to(dev).long()[r, p // bs]
    return cache.key[:layers, blocks, p % bs], cache.value[:layers, blocks, p % bs]


class TreeStep:
    """One strategy's tree verify step over a copy of `base` (the prefix in the cache).

    target: the model (its layers 0 .. L-1 are the cache's first L layers); tables: block ids per
    request of `base`; forced: per request a [N] bool path mask, or None for greedy acceptance."""

    def __init__(self, target, base: PagedKVCache, tables: list[list[int]], batch: TreeBatch, strategy: str,
                 attention: str = "auto", forced=None):
        self.target, self.base, self.batch, self.strategy = target, base, batch, strategy
        self.attention = attention
        self.layers = target.config.num_hidden_layers
        self.cache = copy_cache(base)
        dev = self.cache.device
        self.tables = torch.tensor(tables, dtype=torch.int32, device=dev)
        self.ctx = torch.tensor(batch.context_lens, device=dev)
        bs = base.spec.block_size
        tokens = torch.tensor(sum((list(t) for t in batch.tokens), []), device=dev)
        self.window = w = TreeWindow.build(batch.parents, self.tables, batch.context_lens, bs, tokens)
        self.policy = policy_for(strategy, self.cache, attention)
        self.policy.reserve(w.num_tokens)
        positions = [n + d for p, n in zip(batch.parents, batch.context_lens) for d in (0, *depths_of(p))]
        self.md = AttentionMetadata.build(self.cache, self.policy, positions, [1 + len(p) for p in batch.parents],
                                          tables, batch.context_lens, attention=attention,
                                          slot_mapping=w.slot_mapping, tree_mask=w.ancestors)
        self.ids = torch.tensor([x for t, toks in zip(batch.t_last, batch.tokens) for x in (t, *toks)], device=dev)
        self.forced = None if forced is None else Acceptance.from_draft_mask(
            w, torch.tensor(sum((list(m) for m in forced), []), dtype=torch.bool, device=dev))
        w.children                       # the host tables, made once before any timed step
        self.remapped = None

    # -- the step --------------------------------------------------------------------------------
    @torch.no_grad()
    def verify(self):
        self.policy.begin(self.window, layers=range(self.layers), kind="verify")
        hidden = self.target(self.ids, self.md)
        return accept_tree_greedy(self.window, self.target.compute_logits(hidden))

    @torch.no_grad()
    def commit(self, verdict) -> Acceptance:
        acc = self.forced if self.forced is not None else verdict.acceptance(self.window)
        self.policy.commit(acc)
        if isinstance(self.policy, RemapPolicy):     # its commit leaves the table to re-point
            self.remapped = self.policy.remap(self.tables, self.ctx)[0]
        return acc

    def step(self):
        verdict = self.verify()
        return verdict, self.commit(verdict)

    # -- the checks ------------------------------------------------------------------------------
    @torch.no_grad()
    def check(self, tol: float, noise: float | None = None) -> dict:
        """Run one step on a fresh copy of the prefix and compare the cache with target-only (module doc).
        The rows pass within max(tol x their largest value, `noise`): target-only's own arithmetic
        noise, its rows from the Triton kernel against the torch reference attention (measured here
        when None and the step runs the kernel; 0 under the reference, which target-only then matches
        in the same order). -> {accepted_len [R], emitted [R] lists (path tokens + bonus),
        exact_compaction, kv_equal, kv_max_abs_err, kv_tolerance, target_only_noise}."""
        self.cache.key.copy_(self.base.key)
        self.cache.value.copy_(self.base.value)
        w, L = self.window, self.layers
        verdict = self.verify()
        acc = self.forced if self.forced is not None else verdict.acceptance(w)
        path = acc.draft_mask.cpu().tolist()
        a_r = acc.accepted_per_request()
        # the verify pass's own rows of t_last and the path (window rows), by depth
        rows, req, pos, d0, row0 = [], [], [], 0, 0
        path_tokens = []
        for r, p in enumerate(self.batch.parents):
            nodes = [i + 1 for i in range(len(p)) if path[d0 + i]]
            depth = depths_of(p)
            nodes.sort(key=lambda i: depth[i - 1])
            rows += [row0] + [row0 + i for i in nodes]
            req += [r] * (1 + len(nodes))
            pos += [self.batch.context_lens[r] + j for j in range(1 + len(nodes))]
            path_tokens.append([self.batch.tokens[r][i - 1] for i in nodes])
            d0, row0 = d0 + len(p), row0 + 1 + len(p)
        rows_t = torch.tensor(rows, device=self.cache.device)
        if self.policy.window_in_buffer:
            computed = (self.policy.staged_key[:L, rows_t].clone(), self.policy.staged_value[:L, rows_t].clone())
        else:
            slots = w.slot_mapping[rows_t]
            bs = self.cache.spec.block_size
            computed = (self.cache.key[:L, slots // bs, slots % bs].clone(),
                        self.cache.value[:L, slots // bs, slots % bs].clone())
        self.commit(verdict)
        tables = self.remapped if self.remapped is not None else self.tables
        got = rows_at(self.cache, tables, req, pos, L)
        exact = all(torch.equal(g, c) for g, c in zip(got, computed))
        ref = target_only_rows(self.target, self.base, self.tables, self.batch, path_tokens, req, pos, self.attention)
        err = max(float((g.float() - f.float()).abs().max()) for g, f in zip(got, ref))
        scale = max(float(f.float().abs().max()) for f in ref)
        if noise is None:
            noise = 0.0
            if use_kernel(self.attention, self.cache.device):
                plain = target_only_rows(self.target, self.base, self.tables, self.batch, path_tokens, req, pos,
                                         "torch")
                noise = max(float((a.float() - b.float()).abs().max()) for a, b in zip(ref, plain))
        bound = max(tol * max(scale, 1e-30), noise)
        emitted = verdict.sampled.cpu().tolist()
        return {"accepted_len": a_r, "acceptance": acc, "path_tokens": path_tokens,
                "bonus": [emitted[r][a] for r, a in enumerate(a_r)], "exact_compaction": exact,
                "kv_equal": err <= bound, "kv_max_abs_err": err, "kv_tolerance": bound, "target_only_noise": noise}


@torch.no_grad()
def target_only_rows(target, base: PagedKVCache, tables: torch.Tensor, batch: TreeBatch, path_tokens, req, pos,
                     attention: str = "auto"):
    """A plain chain pass of [t_last, path] at n .. n + a per request over a copy of `base`; the K/V it
    wrote at (req, pos) for the target's layers."""
    ref = copy_cache(base)
    ids = [x for t, p in zip(batch.t_last, path_tokens) for x in (t, *p)]
    md = AttentionMetadata.build(ref, None, pos, [1 + len(p) for p in path_tokens], tables.tolist(),
                                 batch.context_lens, attention=attention)
    target(torch.tensor(ids, device=ref.device), md)
    out = rows_at(ref, tables, req, pos, target.config.num_hidden_layers)
    del ref
    return out


def time_steps(steps: dict, reps: int, warmup: int = 2) -> dict:
    """Round-robin over `steps` {name: TreeStep}: per name the median step ms and commit ms (CUDA events
    on a GPU, host clock on CPU; eager, host work included; one sync per step, as an engine's loop)."""
    cuda = next(iter(steps.values())).cache.device.type == "cuda"
    for s in steps.values():
        for _ in range(warmup):
            s.step()
    times = {name: ([], []) for name in steps}
    for _ in range(reps):
        for name, s in steps.items():
            if cuda:
                e = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
                e[0].record()
                v = s.verify()
                e[1].record()
                s.commit(v)
                e[2].record()
                e[2].synchronize()
                step, commit = e[0].elapsed_time(e[2]), e[1].elapsed_time(e[2])
            else:
                t0 = time.perf_counter()
                v = s.verify()
                t1 = time.perf_counter()
                s.commit(v)
                t2 = time.perf_counter()
                step, commit = 1e3 * (t2 - t0), 1e3 * (t2 - t1)
            times[name][0].append(step)
            times[name][1].append(commit)
    return {name: (_median(a), _median(b)) for name, (a, b) in times.items()}


def graph_steps_ms(steps: dict, reps: int = 10, profile: bool = False) -> dict:
    """Each step {name: TreeStep} captured as one CUDA graph, the graphs replayed in turn, ABBA (each
    repeat times every one once, so clock drift hits the strategies alike and their ratio holds):
    {name: {"ms": median ms, "reps_ms": [ms per repeat], "error": None, "kernels": None}}, or {"ms": None,
    "error": why} for a step that cannot be captured. `profile`: "kernels" from the same graphs' replays,
    interleaved (`graph_profile.replay_profile`; None if the replays could not be told apart)."""
    from nwor_lab.bench.graph_profile import replay_profile
    from nwor_lab.bench.kernels import interleaved_times_us
    from nwor_lab.ops.graphs import capture_graph
    graphs, out = {}, {}
    for name, step in steps.items():
        try:
            graphs[name] = capture_graph(step.step, device=step.cache.device)
        except Exception as e:     # noqa: BLE001 -- reported in the row, the eager numbers stand
            torch.cuda.synchronize()
            out[name] = {"ms": None, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160]}", "kernels": None}
    if graphs:
        us = interleaved_times_us({n: g.replay for n, g in graphs.items()}, iters=3, reps=max(reps, 15), warmup=2,
                                  abba=True)
        kernels = replay_profile(graphs) if profile else None
        out.update({n: {"ms": statistics.median(t) / 1e3, "reps_ms": [round(x / 1e3, 4) for x in t], "error": None,
                        "kernels": kernels and kernels.get(n)} for n, t in us.items()})
    graphs.clear()
    return out


def kernel_profile(step: TreeStep, reps: int = 3, top: int = 8) -> list[dict]:
    """Where a step's GPU time goes: its CUDA kernels under torch.profiler over `reps` eager steps,
    the `top` by time -> [{kernel, us_per_step, calls_per_step}] (names cut to 90 characters)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    step.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            step.step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA and e.device_time_total > 0]
    kernels.sort(key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in kernels)
    out = [{"kernel": e.key[:90], "us_per_step": round(e.device_time_total / reps, 1),
            "calls_per_step": round(e.count / reps, 2)} for e in kernels[:top]]
    out.append({"kernel": "(all kernels)", "us_per_step": round(total / reps, 1),
                "calls_per_step": round(sum(e.count for e in kernels) / reps, 2)})
    return out


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def new_cache(target, num_blocks: int, block_size: int, extra_layers: int = 0) -> PagedKVCache:
    """A cache for `target`'s layers (+ `extra_layers`, e.g. the EAGLE head's) on its device and dtype."""
    cfg = target.config
    p = next(target.parameters())
    spec = KVCacheSpec(cfg.num_hidden_layers + extra_layers, num_blocks, block_size, cfg.num_key_value_heads,
                       cfg.head_dim, dtype=p.dtype)
    return PagedKVCache(spec, p.device)
