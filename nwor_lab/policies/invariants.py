"""Random windows and the cache invariants every write policy must keep.

After a committed window, with `before` the cache before it and `off_after` what `off` leaves:
  - every committed (kept, non-padding) slot equals what `off` wrote, in every written layer;
  - `off`:   every non-padding slot of the window was written;
  - `cow`:   every rejected draft slot is bit-identical to `before`;
  - `stage`: every rejected draft slot is bit-identical to `before` (never touched);
  - no slot outside the window changed;
  - committed drafts == accepted drafts.
Used by the tests, `nwor-lab selfcheck` and the notebooks.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from nwor_lab.kv.cache import PagedKVCache
from nwor_lab.window import Window
from nwor_lab.ops.quant import raw


@dataclass
class RandomWindow:
    window: Window
    key: torch.Tensor          # [L, T, H, D] new K/V for every layer
    value: torch.Tensor
    accepted_len: list[int]    # [R] the acceptance the test will commit
    draft_mask: torch.Tensor   # [Dtot] bool, prefix-closed
    sampled_token_ids: torch.Tensor  # [R, max_spec_len + 1] consistent with accepted_len (-1 padded)


def random_window(cache: PagedKVCache, gen: torch.Generator, *, num_reqs: int = 4, max_k: int = 4,
                  spec_frac: float = 0.6, max_prefill: int = 6, pad_frac: float = 0.1,
                  vocab: int = 50) -> RandomWindow:
    """A mixed batch: speculative requests (t_last + k drafts, accepted length 0..k), prefills and
    plain decodes; unique random slots with some -1 padding; K/V in the cache's model dtype."""
    def randint(lo, hi):  # inclusive
        return int(torch.randint(lo, hi + 1, (), generator=gen))
    sched, drafts, acc = [], [], []
    for _ in range(num_reqs):
        if torch.rand((), generator=gen) < spec_frac:
            k = randint(1, max_k)
            sched.append(k + 1), drafts.append(k), acc.append(randint(0, k))
        else:
            sched.append(randint(1, max_prefill)), drafts.append(0), acc.append(0)
    t = sum(sched)
    if t > cache.num_slots:
        raise ValueError(f"cache too small: {t} tokens, {cache.num_slots} slots")
    slots = torch.randperm(cache.num_slots, generator=gen)[:t]
    slots = torch.where(torch.rand(t, generator=gen) < pad_frac, torch.full_like(slots, -1), slots)
    draft_ids = torch.randint(0, vocab, (sum(drafts),), generator=gen)
    s = cache.spec
    key = torch.randn((s.num_layers, t, s.num_kv_heads, s.head_size), generator=gen).to(s.dtype)
    value = torch.randn(key.shape, generator=gen).to(s.dtype)
    mask, sampled = [], torch.full((num_reqs, max(drafts, default=0) + 1), -1, dtype=torch.int64)
    start = 0
    for r, (k, a) in enumerate(zip(drafts, acc)):
        mask += [j < a for j in range(k)]
        sampled[r, :a] = draft_ids[start:start + a]
        # the token after the accepted prefix: a recovered token (never the rejected draft) or the bonus
        nxt = randint(0, vocab - 1)
        if a < k and nxt == int(draft_ids[start + a]):
            nxt = (nxt + 1) % vocab
        sampled[r, a] = nxt
        start += k
    dev = cache.device
    window = Window.from_counts(sched, drafts, slots.to(dev), draft_ids.to(dev))
    return RandomWindow(window, key.to(dev), value.to(dev), acc, torch.tensor(mask, dtype=torch.bool, device=dev),
                        sampled.to(dev))


def run_window(policy, rw: RandomWindow, chunks: int = 1, acceptance="mask"):
    """Drive one window through `policy`: begin, write every layer (in `chunks` pieces), commit.

    acceptance: "mask" commits the draft mask, "sampled" commits the sampled ids (SCV runs)."""
    policy.begin(rw.window)
    t = rw.window.num_tokens
    bounds = torch.linspace(0, t, chunks + 1).round().long().tolist()
    for layer in range(policy.cache.num_layers):
        for a, b in zip(bounds[:-1], bounds[1:]):
            if b > a:
                policy.write(layer, rw.key[layer, a:b], rw.value[layer, a:b], token_offset=a)
    if acceptance == "sampled":
        return policy.commit(sampled_token_ids=rw.sampled_token_ids)
    return policy.commit(rw.draft_mask)


def check_invariants(mode: str, cache: PagedKVCache, before, off_after, rw: RandomWindow) -> list[str]:
    """Return the violated invariants (empty list = all hold). `before`/`off_after`: (key, value)."""
    w, bs = rw.window, cache.spec.block_size
    problems = []
    slots = w.slot_mapping.cpu()
    commit_mask = w.commit_mask_from(torch.tensor(rw.accepted_len, dtype=torch.int32)).cpu()
    kept = slots[(slots >= 0) & commit_mask]
    rejected = slots[(slots >= 0) & ~commit_mask]
    touched = slots[slots >= 0]
    for name, now, old, off in (("key", cache.key, before[0], off_after[0]),
                                ("value", cache.value, before[1], off_after[1])):
        now, old, off = raw(now).cpu(), raw(old).cpu(), raw(off).cpu()
        def rows(t, s):
            return t[:, s // bs, s % bs]
        if not torch.equal(rows(now, kept), rows(off, kept)):
            problems.append(f"{mode}: a committed {name} slot differs from what off wrote")
        if mode == "off" and not torch.equal(rows(now, touched), rows(off, touched)):
            problems.append(f"off: a {name} slot of the window was not written")
        if mode in ("cow", "stage") and not torch.equal(rows(now, rejected), rows(old, rejected)):
            problems.append(f"{mode}: a rejected {name} slot is not bit-identical to before the window")
        outside = torch.ones(cache.num_slots, dtype=torch.bool)
        outside[touched] = False
        idx = torch.nonzero(outside).flatten()
        if not torch.equal(rows(now, idx), rows(old, idx)):
            problems.append(f"{mode}: a {name} slot outside the window changed")
    return problems
