"""The ordinary SpecEngine on one rank of a tensor-parallel group, fed that rank's shards.

What makes N engines (one per rank) one engine:

- Model: the target and head are the rank's shards (`nwor_lab.distributed.shard`), so the engine's
  single PagedKVCache is the rank's cache shard: its KV heads, every layer (target 0..N-1 and the
  head's layer N, which the seed system forgot), and its write policy is the rank's.
- Sampler agreement: rank 0's sampler output is THE output. Every rank runs the rejection sampler
  (same seed, same shapes: the generators stay in step), then the `[R, k+1]` sampled ids are
  broadcast from rank 0 before SCV turns them into an Acceptance (`AgreedScv`); the drafter's ids
  are broadcast the same way (`AgreedDrafter`). Every rank thus accepts, commits, restores or skips
  the same rows and schedules the same next window, even where its own logits differ in the last
  bit (NCCL does not promise bit-equal all-reduce results on every rank; temperature > 0 turns
  such a bit into a different token). The broadcast is a few int64s per window.
- Debug (`LabConfig.debug`): `CrossRankCheck` compares, after every committed window, what each
  rank committed: the same slots, the same accepted count, committed == accepted on every rank;
  `AgreedScv` counts how often a rank's own sample differed from rank 0's (`disagreements`), and
  the group compares every all-reduce's result over the ranks, bit for bit (`group.bit_mismatches`).

`make_tensor_parallel(engine, group)` installs this on any SpecEngine (e.g. the one
`engine.generate.prepare` builds); `TPSpecEngine` is a SpecEngine that does it in its constructor.
"""
from __future__ import annotations

import logging

import torch

from nwor_lab.distributed.group import TPGroup
from nwor_lab.engine.drafter import Drafter
from nwor_lab.engine.engine import SpecEngine

log = logging.getLogger("nwor_lab.distributed")


class AgreedScv:
    """Wraps the engine's ScvRunner: the sampler's output is made rank 0's on every rank (in place,
    so the engine's Verdict reads the same ids) before the acceptance is computed."""

    def __init__(self, inner, group: TPGroup, debug: bool = False):
        self.inner, self.group, self.debug = inner, group, debug
        self.windows = 0
        self.disagreements = 0        # debug: windows where this rank's own sample differed from rank 0's

    def __getattr__(self, name):      # mode, state, ... of the wrapped runner
        return getattr(self.inner, name)

    def accept(self, window, sampled: torch.Tensor, *args, **kw):
        own = sampled.clone() if self.debug else None
        self.group.broadcast_(sampled, src=0)
        if own is not None and not torch.equal(own, sampled):
            self.disagreements += 1
            log.warning("tp rank %d: window %d: own sampled ids differed from rank 0's (rank 0's used)",
                        self.group.rank, self.windows)
        self.windows += 1
        return self.inner.accept(window, sampled, *args, **kw)


class AgreedDrafter(Drafter):
    """The engine's Drafter whose proposals (draft ids) are rank 0's on every rank."""

    def __init__(self, head, policy, k: int, temperature: float, generator: torch.Generator, group: TPGroup):
        super().__init__(head, policy, k, temperature, generator)
        self.group = group

    @classmethod
    def wrapping(cls, drafter: Drafter, group: TPGroup) -> "AgreedDrafter":
        return cls(drafter.head, drafter.policy, drafter.k, drafter.temperature, drafter.generator, group)

    def propose(self, g: torch.Tensor, generators: dict | None = None):
        ids, probs = super().propose(g, generators)
        return self.group.broadcast_(ids.contiguous(), src=0), probs


class CrossRankCheck:
    """Debug observer: after every committed window, every rank committed the same slots and the
    same number of drafts, and committed == accepted. Raises on every rank at once (each compares
    the same gathered numbers), so no rank is left waiting in a collective."""

    def __init__(self, group: TPGroup):
        self.group = group
        self.windows = 0

    def on_phase(self, event) -> None:
        if event.phase != "commit" or event.record is None:
            return
        w, acc, rec = event.window, event.acceptance, event.record
        kept = acc.commit_mask & (w.slot_mapping >= 0)
        slots = w.slot_mapping[kept].to(torch.long)
        dev = self.group.device
        counts = torch.tensor([rec.num_accepted, rec.drafts_committed, rec.tokens_committed, slots.numel()],
                              dtype=torch.long, device=dev)
        every = [c.tolist() for c in self.group.all_gather(counts)]
        every_slots = [s.cpu() for s in self.group.all_gather_ragged(slots.to(dev))]
        bad = []
        for r, (c, s) in enumerate(zip(every, every_slots)):
            if c[0] != c[1]:
                bad.append(f"rank {r} committed {c[1]} drafts but accepted {c[0]}")
            if c != every[0] or not torch.equal(s, every_slots[0]):
                bad.append(f"rank {r} committed {c[2]} tokens / slots {s.tolist()[:8]}.. , rank 0 "
                           f"{every[0][2]} / {every_slots[0].tolist()[:8]}..")
        if bad:
            raise AssertionError(f"NWOR tp debug ({event.kind or 'a'} window {rec.index}): " + "; ".join(bad))
        self.windows += 1


def make_tensor_parallel(engine: SpecEngine, group: TPGroup) -> SpecEngine:
    """Make `engine` (built on this rank's shards) one rank of a tensor-parallel engine, in place."""
    check_engine_shards(engine, group)
    engine.tp_group = group
    group.check_bits = engine.config.debug      # debug: every all-reduce's result bit-equal on every rank
    if group.world_size > 1:
        engine.scv = AgreedScv(engine.scv, group, debug=engine.config.debug)
        if engine.drafter is not None:
            engine.drafter = AgreedDrafter.wrapping(engine.drafter, group)
        if engine.config.debug:
            engine.observers.append(CrossRankCheck(group))
    return engine


def check_engine_shards(engine: SpecEngine, group: TPGroup) -> None:
    """The engine's models must be this group's shards (built for the same world size), and the
    cache must hold the head's layer (the seed system's bug: target layers only)."""
    for what, m in (("target", engine.target), ("draft head", engine.head)):
        if m is None:
            continue
        g = getattr(m, "tp_group", None)
        if group.world_size > 1 and (g is None or g.world_size != group.world_size or g.rank != group.rank):
            raise ValueError(f"the {what} is not rank {group.rank}'s shard for tp={group.world_size}; build it "
                             f"with nwor_lab.distributed.shard_llama / shard_head / load_tiny_tp")
    want = engine.target.num_layers + (1 if engine.head is not None else 0)
    if engine.cache.num_layers != want:
        raise ValueError(f"rank {group.rank}: the cache has {engine.cache.num_layers} layers, the target and "
                         f"head need {want} (the head's layer is layer {engine.target.num_layers})")


class TPSpecEngine(SpecEngine):
    """`SpecEngine(target_shard, head_shard, config, **kw)` as one rank of `group`."""

    def __init__(self, target, head=None, config=None, *, group: TPGroup, **kw):
        super().__init__(target, head, config, **kw)
        make_tensor_parallel(self, group)
