"""Random windows and the cache invariants every write policy must keep.

After a committed window, with `before` the cache before it and `off_after` what `off` leaves:
  - every committed (kept, non-padding) slot equals what `off` wrote, in every written layer;
  - a policy that preserves rejected slots (`cow`, `stage`): every rejected draft slot is
    bit-identical to `before`; any other (`off`): every non-padding slot of the window was written;
  - no slot outside the window changed;
  - committed drafts == accepted drafts.
Which of these apply is read from what the policy declares (`preserves_rejected_slots`), never
from its name. Used by the tests and `nwor-lab selfcheck`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from nwor_lab.kv.cache import PagedKVCache
from nwor_lab.kv.blocks import slot_to_block_offset
from nwor_lab.window import Acceptance, Window
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


def run_window(policy, rw: RandomWindow, chunks: int = 1, acceptance: Acceptance | None = None):
    """Drive one window through `policy`: begin, write every layer (in `chunks` pieces), commit
    `acceptance` (default: the random window's own draft mask)."""
    policy.begin(rw.window)
    t = rw.window.num_tokens
    bounds = torch.linspace(0, t, chunks + 1).round().long().tolist()
    for layer in range(policy.cache.num_layers):
        for a, b in zip(bounds[:-1], bounds[1:]):
            if b > a:
                policy.write(layer, rw.key[layer, a:b], rw.value[layer, a:b], token_offset=a)
    return policy.commit(acceptance or Acceptance.from_draft_mask(rw.window, rw.draft_mask))


def off_reference(cache: PagedKVCache, before, rw: RandomWindow):
    """What `off` leaves (every row of every layer written), computed with the reference op on a
    copy of `before` (key, value) -> (key, value)."""
    from nwor_lab.ops.write_kv import write_kv_reference

    key, value = before[0].clone(), before[1].clone()
    for layer in range(cache.num_layers):
        ks, vs = cache.layer_scales(layer)
        write_kv_reference(rw.key[layer], rw.value[layer], key[layer], value[layer], rw.window.slot_mapping,
                           ks, vs)
    return key, value


def check_invariants(policy, cache: PagedKVCache, before, off_after, rw: RandomWindow) -> list[str]:
    """Return the violated invariants (empty list = all hold). `policy`: the policy (or its class)
    that ran the window; `before`/`off_after`: (key, value)."""
    w, bs = rw.window, cache.spec.block_size
    name, preserves = policy.name, policy.preserves_rejected_slots
    problems = []
    slots = w.slot_mapping.cpu()
    commit_mask = w.commit_mask_from(torch.tensor(rw.accepted_len, dtype=torch.int32)).cpu()
    kept = slots[(slots >= 0) & commit_mask]
    rejected = slots[(slots >= 0) & ~commit_mask]
    touched = slots[slots >= 0]
    for what, now, old, off in (("key", cache.key, before[0], off_after[0]),
                                ("value", cache.value, before[1], off_after[1])):
        now, old, off = raw(now).cpu(), raw(old).cpu(), raw(off).cpu()
        def rows(t, s):
            block, offset = slot_to_block_offset(s, bs)
            return t[:, block, offset]
        if not torch.equal(rows(now, kept), rows(off, kept)):
            problems.append(f"{name}: a committed {what} slot differs from what off wrote")
        if not preserves and not torch.equal(rows(now, touched), rows(off, touched)):
            problems.append(f"{name}: a {what} slot of the window was not written")
        if preserves and not torch.equal(rows(now, rejected), rows(old, rejected)):
            problems.append(f"{name}: a rejected {what} slot is not bit-identical to before the window")
        outside = torch.ones(cache.num_slots, dtype=torch.bool)
        outside[touched] = False
        idx = torch.nonzero(outside).flatten()
        if not torch.equal(rows(now, idx), rows(old, idx)):
            problems.append(f"{name}: a {what} slot outside the window changed")
    return problems
