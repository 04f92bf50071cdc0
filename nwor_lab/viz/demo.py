"""A small, readable verify window to watch a write policy at work (chapters and tests use it).

`demo_window` builds one random mixed batch the way a scheduler would: each request owns block
tables with a committed prefix already in the cache; the window schedules the next tokens
(`t_last + k drafts` for a speculative request, a few tokens for a prefill, one for a plain
decode), so the picture shows requests in their own blocks. `demo_frames(mode)` drives that window
through a fresh policy of that mode with a `Recorder` attached and returns its frames; the same
seed gives the same window in every mode, so modes compare phase by phase.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from nwor_lab.config import LabConfig
from nwor_lab.kv import BlockAllocator, BlockTable, KVCacheSpec, PagedKVCache
from nwor_lab.ops import write_kv
from nwor_lab.speculative.scv import compute_acceptance
from nwor_lab.window import Acceptance, Window

__all__ = ["DemoWindow", "demo_cache", "demo_window", "demo_frames", "demo_frames_by_mode", "record_generate"]


@dataclass
class DemoWindow:
    window: Window
    key: torch.Tensor            # [L, T, H, D] the window's new K/V, every layer
    value: torch.Tensor
    acceptance: Acceptance       # what the rejection sampler + SCV decided (commit mask included)
    sampled_token_ids: torch.Tensor  # [R, k + 1], -1 placeholders
    prefix_len: list[int]        # [R] tokens each request had committed before the window


def demo_cache(num_layers: int = 2, num_blocks: int = 12, block_size: int = 8, num_kv_heads: int = 2,
               head_size: int = 4) -> PagedKVCache:
    return PagedKVCache(KVCacheSpec(num_layers=num_layers, num_blocks=num_blocks, block_size=block_size,
                                    num_kv_heads=num_kv_heads, head_size=head_size))


def demo_window(cache: PagedKVCache, seed: int = 0, *, num_reqs: int = 3, k: int = 3,
                pad_tokens: int = 0, vocab: int = 50) -> DemoWindow:
    """One random mixed window over `cache`; writes each request's committed prefix into the cache.

    Requests 0 and 1 are speculative; the others speculative, prefill or plain decode at random.
    pad_tokens > 0 appends a padding request (slot -1, as CUDA-graph padding). Accepted lengths
    are drawn from 0..k (request 0: 1..k-1, so every demo shows kept and rejected drafts); the
    sampled ids are consistent with them (a recovered token after the accepted prefix, then -1).
    """
    gen = torch.Generator().manual_seed(seed)
    def randint(lo, hi):  # inclusive
        return int(torch.randint(lo, hi + 1, (), generator=gen))
    bs, spec = cache.spec.block_size, cache.spec
    others = [("spec", "prefill", "decode")[randint(0, 2)] for _ in range(num_reqs - 2)]
    kinds = (["spec", "spec"] + others)[:num_reqs]
    sched = [k + 1 if c == "spec" else randint(2, bs) if c == "prefill" else 1 for c in kinds]
    drafts = [k if c == "spec" else 0 for c in kinds]
    prefix = [0 if c == "prefill" else randint(1, bs + bs // 2) for c in kinds]
    alloc = BlockAllocator(spec.num_blocks)
    tables = [BlockTable(alloc, bs) for _ in kinds]
    for t, p in zip(tables, prefix):      # prefixes first, the window's blocks later: as a
        t.ensure(p)                       # scheduler interleaves requests over time
    for t, p, n in zip(tables, prefix, sched):
        t.ensure(p + n)
    for t, p in zip(tables, prefix):      # the committed history: random K/V in every layer
        if p:
            slots = torch.tensor(t.slots(range(p)), device=cache.device)
            for layer in range(spec.num_layers):
                kv = torch.randn((2, p, spec.num_kv_heads, spec.head_size), generator=gen).to(spec.dtype)
                write_kv(kv[0].to(cache.device), kv[1].to(cache.device), *cache.layer(layer), slots)
    slots = [s for t, p, n in zip(tables, prefix, sched) for s in t.slots(range(p, p + n))]
    if pad_tokens:
        sched.append(pad_tokens), drafts.append(0), prefix.append(0)
        slots += [-1] * pad_tokens
    draft_ids = torch.randint(0, vocab, (sum(drafts),), generator=gen)
    sampled = torch.full((len(sched), max(drafts) + 1), -1, dtype=torch.int64)
    start = 0
    for r, n in enumerate(drafts):
        if n:
            a = randint(1, n - 1) if r == 0 and n >= 2 else randint(0, n)  # request 0: both fates
            sampled[r, :a] = draft_ids[start:start + a]
            nxt = randint(0, vocab - 1)   # recovered token (never the rejected draft) or the bonus
            sampled[r, a] = (nxt + 1) % vocab if a < n and nxt == int(draft_ids[start + a]) else nxt
        start += n
    dev = cache.device
    window = Window.from_counts(sched, drafts, torch.tensor(slots, device=dev), draft_ids.to(dev))
    acceptance = compute_acceptance(window.draft_token_ids, window.cu_num_draft_tokens, sampled.to(dev),
                                    token_req=window.token_req, token_draft_pos=window.token_draft_pos)
    kv = torch.randn((2, spec.num_layers, window.num_tokens, spec.num_kv_heads, spec.head_size),
                     generator=gen).to(spec.dtype).to(dev)
    return DemoWindow(window, kv[0], kv[1], acceptance, sampled.to(dev), prefix)


def demo_frames(mode_name: str, seed: int = 0, *, layers=None, num_reqs: int = 3, k: int = 3,
                pad_tokens: int = 0, **cache_shape) -> list:
    """Frames of ONE demo window driven through a fresh `make_policy(LabConfig(nwor_mode=mode_name))`:
    begin, one write per layer, acceptance, commit. `cache_shape`: demo_cache's arguments."""
    from nwor_lab.policies import make_policy
    from nwor_lab.viz.recorder import Recorder

    cache = demo_cache(**cache_shape)
    demo = demo_window(cache, seed, num_reqs=num_reqs, k=k, pad_tokens=pad_tokens)
    policy = make_policy(LabConfig(nwor_mode=mode_name), cache)
    recorder = Recorder(layers).attach(policy)
    policy.begin(demo.window, kind="verify")
    for layer in range(cache.num_layers):
        policy.write(layer, demo.key[layer], demo.value[layer])
    policy.commit(demo.acceptance)
    recorder.detach(policy)
    return recorder.frames


def demo_frames_by_mode(seed: int = 0, modes=None, **kwargs) -> dict:
    """`{mode: demo_frames(mode, seed, ...)}` for every registered write policy (or `modes`)."""
    from nwor_lab.policies import POLICIES
    return {m: demo_frames(m, seed, **kwargs) for m in (modes or POLICIES)}


def record_generate(prompts, mode_name: str = "stage", *, layers=None, kinds=None, max_windows: int | None = None,
                    **generate_kwargs):
    """Run `nwor_lab.engine.generate` (the shipped pair by default) with a `Recorder` attached to
    the engine's policies; returns `(frames, generation_result)`. Windows of every kind are
    recorded: the prefill/verify windows and the EAGLE draft chain ("draft", head layer only)."""
    from nwor_lab.engine import generate
    from nwor_lab.viz.recorder import Recorder

    recorder = Recorder(layers, kinds=kinds, max_windows=max_windows)
    out = generate(prompts, config=LabConfig(nwor_mode=mode_name), observers=[recorder], **generate_kwargs)
    return recorder.frames, out
