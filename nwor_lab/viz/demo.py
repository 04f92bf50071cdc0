"""Small, readable verify windows to watch a write policy at work (chapters and tests use them).

`demo_windows` builds random mixed batches the way a scheduler would: each request owns block
tables with a committed prefix already in the cache; the first window schedules the next tokens
(`t_last + k drafts` for a speculative request, a few tokens for a prefill, one for a plain
decode), so the picture shows requests in their own blocks; each later window continues the same
requests after what the previous one kept (a prefill then drafts too), so under `off` it writes
over the slots the rejected drafts dirtied. `demo_frames(mode)` drives those windows through a
fresh policy of that mode with a `Recorder` attached and returns its frames; the same seed gives
the same windows in every mode, so modes compare phase by phase.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nwor_lab.config import LabConfig
from nwor_lab.kv import BlockAllocator, BlockTable, KVCacheSpec, PagedKVCache
from nwor_lab.ops import write_kv
from nwor_lab.speculative.scv import compute_acceptance
from nwor_lab.window import Acceptance, Window

__all__ = ["DemoWindow", "demo_cache", "demo_window", "demo_windows", "demo_frames", "demo_frames_by_mode",
           "record_generate"]


@dataclass
class DemoWindow:
    window: Window
    key: torch.Tensor            # [L, T, H, D] the window's new K/V, every layer
    value: torch.Tensor
    acceptance: Acceptance       # what the rejection sampler + SCV decided (commit mask included)
    sampled_token_ids: torch.Tensor  # [R, k + 1], -1 placeholders
    prefix_len: list[int]        # [R] tokens each request had committed before the window
    prefix_slots: list[int] = field(default_factory=list)   # slots of the history written before window 0


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
    return demo_windows(cache, seed, num_windows=1, num_reqs=num_reqs, k=k, pad_tokens=pad_tokens, vocab=vocab)[0]


def demo_windows(cache: PagedKVCache, seed: int = 0, *, num_windows: int = 2, num_reqs: int = 3, k: int = 3,
                 pad_tokens: int = 0, vocab: int = 50, reused_block: bool = False) -> list[DemoWindow]:
    """`num_windows` consecutive windows of the same requests over `cache` (the first as
    `demo_window` builds it, same seed same window); writes the committed prefixes into the cache.
    Window i + 1 starts where window i's commit left each request: after `t_last` and its accepted
    drafts (a speculative request), its prompt (a prefill, which then drafts `k`), its token (a plain
    decode). Acceptances are drawn up front, so they do not depend on the policy that runs them.
    reused_block: the block of request 0's last draft (always rejected) was a finished request's
    before: its slots past request 0's prefix still hold that request's K/V (old contents), so the
    window's rejected draft lands on old bits."""
    if num_windows < 1:
        raise ValueError(f"num_windows={num_windows}: must be >= 1")
    gen = torch.Generator().manual_seed(seed)
    def randint(lo, hi):  # inclusive
        return int(torch.randint(lo, hi + 1, (), generator=gen))
    bs, spec = cache.spec.block_size, cache.spec
    others = [("spec", "prefill", "decode")[randint(0, 2)] for _ in range(num_reqs - 2)]
    kinds = (["spec", "spec"] + others)[:num_reqs]
    sched = [k + 1 if c == "spec" else randint(2, bs) if c == "prefill" else 1 for c in kinds]
    prefix = [0 if c == "prefill" else randint(1, bs + bs // 2) for c in kinds]
    alloc = BlockAllocator(spec.num_blocks)
    tables = [BlockTable(alloc, bs) for _ in kinds]
    for t, p in zip(tables, prefix):      # prefixes first, the window's blocks later: as a
        t.ensure(p)                       # scheduler interleaves requests over time
    history = []
    for t, p in zip(tables, prefix):      # the committed history: random K/V in every layer
        if p:
            slots = torch.tensor(t.slots(range(p)), device=cache.device)
            history += slots.tolist()
            for layer in range(spec.num_layers):
                kv = torch.randn((2, p, spec.num_kv_heads, spec.head_size), generator=gen).to(spec.dtype)
                write_kv(kv[0].to(cache.device), kv[1].to(cache.device), *cache.layer(layer), slots)
    out = []
    for i in range(num_windows):
        if i:   # where the last window's commit left each request
            kept = [1 + a if c == "spec" else n for c, n, a in zip(kinds, sched, out[-1].acceptance.accepted_len.tolist())]
            prefix = [p + n for p, n in zip(prefix, kept)]
            kinds = ["decode" if c == "decode" else "spec" for c in kinds]
            sched = [1 if c == "decode" else k + 1 for c in kinds]
        for t, p, n in zip(tables, prefix, sched):
            t.ensure(p + n)
        if i == 0 and reused_block:   # a finished request's bits past request 0's prefix, in its last draft's block
            last = tables[0].slots([prefix[0] + sched[0] - 1])[0]
            block = last // spec.block_size
            old = [s for s in range(block * spec.block_size, (block + 1) * spec.block_size) if s not in set(history)]
            slots = torch.tensor(old, device=cache.device)
            for layer in range(spec.num_layers):
                kv = torch.randn((2, len(old), spec.num_kv_heads, spec.head_size), generator=gen).to(spec.dtype)
                write_kv(kv[0].to(cache.device), kv[1].to(cache.device), *cache.layer(layer), slots)
        demo = _one_window(cache, gen, randint, tables, kinds, sched, prefix, k, pad_tokens, vocab)
        out.append(demo)
    out[0].prefix_slots = history
    return out


def _one_window(cache, gen, randint, tables, kinds, sched, prefix, k, pad_tokens, vocab):
    spec = cache.spec
    sched, prefix = list(sched), list(prefix)
    drafts = [k if c == "spec" else 0 for c in kinds]
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
                pad_tokens: int = 0, windows: int = 2, reused_block: bool = True, **cache_shape) -> list:
    """Frames of `windows` demo windows (`demo_windows`) driven through a fresh
    `make_policy(LabConfig(nwor_mode=mode_name))`: per window begin, one write per layer,
    acceptance, commit. The requests' prefixes start COMMITTED, a reused block's other bits OLD
    (`reused_block`, see demo_windows). `cache_shape`: demo_cache's arguments."""
    from nwor_lab.policies import make_policy
    from nwor_lab.viz.recorder import Recorder

    cache = demo_cache(**cache_shape)
    demos = demo_windows(cache, seed, num_windows=windows, num_reqs=num_reqs, k=k, pad_tokens=pad_tokens,
                         reused_block=reused_block)
    policy = make_policy(LabConfig(nwor_mode=mode_name), cache)
    recorder = Recorder(layers, committed=demos[0].prefix_slots).attach(policy)
    for demo in demos:
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
