"""One request decoded by the lab's engine, and what its blocks hold afterwards: the cache a
consumer of KV blocks would see.

    ref  = reference_outputs(prompts, max_new_tokens + k + 1)           # target-only, greedy
    a    = run_request(prompt, "off", k=4, max_new_tokens=64)
    b    = run_request(prompt, "off", k=4, max_new_tokens=64, reference=ref[0], redraw_seed=1)
    same_blocks(a, b)          # [True, True, True, False]: per block of the request, equal digests?
    differing_over_time(a, b)  # [0, 1, 1, 0, 1, ...]: blocks that differ after each verify window
    rejected_bytes(a, clean)   # bytes of its blocks that differ from what stage left (clean)

A request runs alone, so the blocks it owns are its own from its prefill to its end (nothing is
freed and reused meanwhile) and `blocks[i]` is its i-th block. `CacheRun` keeps a copy of those
blocks' K and V in every layer, their digests (`nwor_lab.kv.digest`), a snapshot after every
verify window (the digests of the blocks it held then, and the bytes held past its kept length:
with nothing freed or reused, those can only be rejected K/V), its trace and the per-block
statistic a write-time observer saw (`stats.WriteTimeAmax`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nwor_lab.config import LabConfig
from nwor_lab.kv.digest import block_digests
from nwor_lab.why.drafts import RedrawRejected
from nwor_lab.why.stats import WriteTimeAmax

__all__ = ["CacheRun", "Snapshot", "run_request", "reference_outputs", "same_blocks", "differing_over_time",
           "rejected_bytes", "differing_slots"]


@dataclass(frozen=True)
class Snapshot:
    """The request's blocks right after one verify window (before the next draft chain)."""

    window: int                      # index of the verify window in the run
    length: int                      # positions whose K/V the policy committed so far (accepted drafts
                                     # cut from the output at the request's end included)
    digests: tuple                   # per block it held then
    tail_bytes: int                  # bytes (slot-layers x K+V) holding bits at positions >= length


@dataclass
class CacheRun:
    """What one request left: output, blocks, their contents and digests, the run's trace."""

    mode: str
    k: int
    redraw_seed: int | None          # None: the head's own drafts; else rejected drafts redrawn with this seed
    token_ids: list[int]
    blocks: list[int]                # physical block of the request's logical block i
    length: int                      # positions whose K/V it kept (num_computed at its last window)
    block_size: int
    digests: list[str]               # per logical block, every layer's K and V
    key: torch.Tensor                # [L, len(blocks), BS, H, D] raw bits of those blocks after the run
    value: torch.Tensor
    accepted: list[list[int]]        # per verify window: accepted drafts per request (the experiment's control)
    trace: list = field(repr=False, default_factory=list)
    write_amax: torch.Tensor | None = None   # [L, len(blocks)] max |K| of everything that reached each block
    redrawn: int = 0                 # drafts replaced by the redraw
    bytes_per_slot_layer: int = 0    # K + V of one slot in one layer, as stored
    snapshots: list = field(default_factory=list)   # [Snapshot] after each verify window

    @property
    def num_layers(self) -> int:
        return self.key.shape[0]


class _Blocks:
    """Engine observer: the request's blocks and kept length at each window's end (before it
    finishes), and a `Snapshot` after each verify window."""

    def __init__(self):
        self.blocks, self.length, self.snapshots, self.verify = [], 0, [], 0

    def on_phase(self, event) -> None:
        pass

    def on_window_end(self, engine, trace, window) -> None:
        for r in engine.scheduler.running:
            self.blocks, self.length = list(r.block_table.blocks), r.num_computed
            if trace.kind == "verify":
                # drafts accepted past max_new_tokens are committed, then cut from the output:
                # their K/V is kept K/V, not rejected
                i = trace.req_ids.index(r.req_id)
                cut = max(0, 1 + trace.accepted[i] - len(trace.emitted[i])) if trace.drafted[i] else 0
                committed = r.num_computed + cut
                self.snapshots.append(Snapshot(self.verify, committed, tuple(block_digests(engine.cache, self.blocks)),
                                               _tail_bytes(engine.cache, self.blocks, committed)))
        if trace.kind == "verify":
            self.verify += 1


def _tail_bytes(cache, blocks, length: int) -> int:
    """Bytes of K and V (as stored) at the positions >= `length` of `blocks` that hold any set bit."""
    idx = torch.tensor(blocks, dtype=torch.long, device=cache.device)
    held = None
    for t in (cache.key, cache.value):      # [L, nb, BS, H, D] -> [L, nb * BS] "a bit is set"
        bits = t[:, idx].contiguous().view(torch.uint8).reshape(t.shape[0], len(blocks) * cache.spec.block_size, -1)
        used = (bits != 0).any(-1)
        held = used if held is None else held | used
    return int(held[:, length:].sum()) * cache.spec.bytes_per_token_layer


def reference_outputs(prompts, max_new_tokens: int, *, target=None, head=None, tokenizer=None, device="cpu"):
    """Target-only greedy outputs (token ids) of `prompts`, `max_new_tokens` each."""
    from nwor_lab.engine import generate
    out = generate(list(prompts), max_new_tokens, k=0, target=target, head=head, tokenizer=tokenizer, device=device)
    return out.token_ids


def run_request(prompt, mode: str, *, k: int, max_new_tokens: int, reference=None, redraw_seed: int | None = None,
                target=None, head=None, tokenizer=None, device="cpu", block_size: int = 16,
                config: LabConfig | None = None) -> CacheRun:
    """Decode `prompt` alone under write policy `mode` (greedy, EAGLE with `k` drafts) and keep
    what its blocks hold. With `redraw_seed`, the drafts the target rejects are redrawn
    (`RedrawRejected`, needs `reference`: the request's target-only output, max_new_tokens + k + 1
    tokens). CUDA graphs are off so every window runs through the (wrapped) drafter."""
    from nwor_lab.engine.generate import prepare

    config = config or LabConfig()
    config = LabConfig(**{**config.__dict__, "nwor_mode": mode, "cuda_graph": False})
    blocks_seen = _Blocks()
    gen = prepare([prompt], max_new_tokens, k, config, target=target, head=head, tokenizer=tokenizer, device=device,
                  block_size=block_size, observers=[blocks_seen])
    engine = gen.engine
    amax = WriteTimeAmax(engine.cache).attach(engine)
    wrapper = None
    if redraw_seed is not None:
        if reference is None:
            raise ValueError("redraw_seed: give the request's target-only output as reference")
        if len(reference) < max_new_tokens + k + 1:
            raise ValueError(f"reference: {len(reference)} tokens; the drafts can reach token "
                             f"{max_new_tokens + k + 1}: generate max_new_tokens + k + 1 target-only tokens")
        wrapper = RedrawRejected({0: reference}, seed=redraw_seed, vocab=engine.target.config.vocab_size)
        engine.observers.append(wrapper)
    gen.run()
    result = gen.result()
    cache = engine.cache
    idx = torch.tensor(blocks_seen.blocks, dtype=torch.long, device=cache.device)
    return CacheRun(mode=mode, k=k, redraw_seed=redraw_seed, token_ids=result.token_ids[0],
                    blocks=blocks_seen.blocks, length=blocks_seen.length, block_size=cache.spec.block_size,
                    digests=block_digests(cache, blocks_seen.blocks),
                    key=cache.key[:, idx].contiguous().cpu(), value=cache.value[:, idx].contiguous().cpu(),
                    accepted=[list(w.accepted) for w in result.trace if w.kind == "verify" and any(w.drafted)],
                    trace=result.trace, write_amax=amax.per_block(blocks_seen.blocks),
                    redrawn=wrapper.redrawn if wrapper is not None else 0,
                    bytes_per_slot_layer=cache.spec.bytes_per_token_layer, snapshots=blocks_seen.snapshots)


def same_blocks(a: CacheRun, b: CacheRun) -> list[bool]:
    """Per logical block of the request: do the two runs' digests agree? The runs must be the same
    request (same output, same blocks)."""
    if a.token_ids != b.token_ids or len(a.blocks) != len(b.blocks):
        raise ValueError("same_blocks: the two runs differ in output or in blocks; compare runs of one request")
    return [x == y for x, y in zip(a.digests, b.digests)]


def differing_over_time(a: CacheRun, b: CacheRun) -> list[int]:
    """After each verify window: how many of the blocks the request held then differ between the
    two runs (runs of one request with the same accepted drafts: their windows line up)."""
    if a.accepted != b.accepted or len(a.snapshots) != len(b.snapshots):
        raise ValueError("differing_over_time: the runs must accept the same drafts (their windows line up)")
    return [sum(x != y for x, y in zip(s.digests, t.digests)) for s, t in zip(a.snapshots, b.snapshots)]


def differing_slots(run: CacheRun, clean: CacheRun) -> torch.Tensor:
    """`[L, len(blocks) * BS]` bool: slots of `run`'s blocks whose K or V bits differ from `clean`'s
    (the same request through a policy whose cache only ever received kept K/V, e.g. stage, with
    the same windows: every kept slot is bit-identical, so what differs is rejected K/V)."""
    if run.token_ids != clean.token_ids or run.accepted != clean.accepted:
        raise ValueError("differing_slots: the runs must have the same output and the same accepted drafts")
    def bits(t):
        return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16 if t.element_size() == 2 else torch.int32)
    k = (bits(run.key) != bits(clean.key)).flatten(3).any(-1)
    v = (bits(run.value) != bits(clean.value)).flatten(3).any(-1)
    return (k | v).flatten(1)


def rejected_bytes(run: CacheRun, clean: CacheRun) -> dict:
    """Bytes of rejected K/V `run`'s blocks carry at its end, against `clean` (see differing_slots):
    `bytes` in all, `slots` (slot-layers), `past_end` (of those, at positions >= the kept length),
    `block_bytes` (the request's blocks, every layer: what shipping them whole moves)."""
    diff = differing_slots(run, clean)
    positions = torch.arange(diff.shape[1])
    n = int(diff.sum())
    return {"bytes": n * run.bytes_per_slot_layer, "slots": n,
            "past_end": int(diff[:, positions >= run.length].sum()),
            "block_bytes": run.num_layers * diff.shape[1] * run.bytes_per_slot_layer}
