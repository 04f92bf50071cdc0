"""Prefix caching in the engine: committed blocks outlive their request, and a new request's prompt
reuses them (`SpecEngine(prefix_cache=PrefixCacheConfig(...))`; off when None).

What is hashed and when: after every window's commit, each request's *committed* full blocks (every
row below `num_computed`: an accepted token's K/V in every layer, the head's included) get their
chained hash (`kv.prefix.block_hash`) and are registered, once. A partial block is never
registered: under write-all (`off`) its rows past `num_computed` can hold rejected drafts' K/V.
Rows below `num_computed` are never written again by their request, nor by anyone sharing them.

At admission the prompt is matched block by block; the hit blocks are shared (reference-counted,
never written) and the prefill starts at the hit length (`Request.num_computed`), which stops one
block short of the prompt's last token at least: the request needs one token to run (vLLM keeps
the last prompt token uncomputed).

The draft head's cache needs more than its block's tokens (its row at position p reads the NEXT
token x[p + 1]): the strategies that keep it right, `HEAD_CACHES` and `LOOKAHEADS`, are in
`nwor_lab.engine.prefix_strategies`; the settings (`PrefixCacheConfig`) and what is refused
(`check_supported`) in `nwor_lab.engine.prefix_settings`. This module is the engine's part
(`PrefixCaching`) and keeps every public name importable from here.

Draft trees: the accepted path is compacted to n+1 .. n+a at the commit, so the registered blocks
hold it; the boundary is kept at each row's committed slot (`window.commit_slots`). Hybrid targets:
the recurrent and conv state after each committed block end is kept beside the block
(`state.checkpoints.BlockStates`) and a hit's slot starts from it (`start_state`).

The step body's part (`keep_boundary`) is device code with no host sync, so a captured step runs
it as the eager one does; the lab's CUDA-graph path could not be run where this was written (no
GPU): the captured path is untested here. The boundary fix-up at admission is an eager head pass.

A host tier (`host_blocks`, `offload`: nwor_lab.engine.offload) keeps evicted cached blocks in host
memory and brings them back on a hit.
"""
from __future__ import annotations

import torch

from nwor_lab.engine.offload import OFFLOADS, HostTier
from nwor_lab.engine.prefix_settings import PrefixCacheConfig, check_supported
from nwor_lab.engine.prefix_strategies import (HEAD_CACHES, LOOKAHEADS, CachedHead, DropLast, HeadCache, KeepBoundary,
                                               Lookahead, MissingHead, RecomputeHead)
from nwor_lab.kv.prefix import CachingAllocator, block_hash, chain_hashes
from nwor_lab.model.attention import AttentionMetadata
from nwor_lab.state.checkpoints import BlockStates
from nwor_lab.window import Window

__all__ = ["HEAD_CACHES", "LOOKAHEADS", "OFFLOADS", "CachedHead", "DropLast", "HeadCache", "KeepBoundary", "Lookahead",
           "MissingHead", "PrefixCacheConfig", "PrefixCaching", "RecomputeHead", "check_supported"]


class PrefixCaching:
    """The engine's prefix cache: the caching allocator, each running request's chain of block hashes,
    the strategies, the boundary store and the counters (`stats()`)."""

    def __init__(self, engine, config: PrefixCacheConfig):
        if not isinstance(config, PrefixCacheConfig):
            raise TypeError(f"prefix_cache: expected a PrefixCacheConfig (nwor_lab.engine.prefix) or None, "
                            f"got {type(config).__name__}")
        check_supported(engine)
        self.engine, self.config = engine, config
        self.head_cache = HEAD_CACHES[config.head_cache]()
        self.lookahead = LOOKAHEADS[config.lookahead]()
        if engine.head is not None:
            self.head_cache.check(engine)
        self.block_size = engine.cache.spec.block_size
        nb = engine.cache.spec.num_blocks
        self.allocator = CachingAllocator(nb, on_idle=self._on_idle, on_evict=self._on_evict)
        self.hashes: dict[int, list[bytes]] = {}      # request id -> hashes of its leading full blocks
        self.hits: dict[int, int] = {}                 # request id -> its hit tokens (what a bench splits by)
        self.boundary_feature = self.boundary_token = None
        if engine.drafting and self.lookahead.keeps_boundary:
            # row NB is a scratch row: the step writes every row there that is not a committed block end
            h = engine.target.config.hidden_size
            self.boundary_feature = torch.zeros(nb + 1, h, dtype=engine.dtype, device=engine.device)
            self.boundary_token = torch.full((nb + 1,), -1, dtype=torch.long, device=engine.device)
        # the host's copy of `boundary_token` for registered blocks (block id -> the token its last head row
        # read, -1 unknown): admission decides on it without reading the device (no sync on the step's
        # path); set where the device's is (commit, recompute_boundary, the host tier's restore)
        self.boundary_host: dict[int, int] = {}
        self.block_states = None
        if engine.states is not None:
            # a hybrid target: the recurrent and conv state at each committed block end, kept beside it
            self.block_states = BlockStates(engine.states.spec, nb, self.block_size, engine.device)
            engine.states.block_states = self.block_states
        self.counts = dict(prompt_tokens=0, hit_tokens=0, requests=0, hit_requests=0, recomputed_tokens=0,
                           head_rows_recomputed=0, blocks_copied=0, registered=0)
        # the host tier (off when host_blocks is 0): evicted cached blocks go to host memory (engine.offload)
        self.host = HostTier(self, config.host_blocks, config.offload) if config.host_blocks else None

    # -- admission ------------------------------------------------------------------------------
    def admit(self, req) -> None:
        """Match `req`'s tokens (its prompt; a request admitted again after giving up its blocks, its
        prompt and output), share the hit blocks and start its prefill after them (the scheduler calls
        this before it allocates the rest of the prompt)."""
        bs, tokens = self.block_size, req.tokens
        hashes = chain_hashes(tokens[:len(tokens) - 1], bs)        # the last token always runs
        hits = self.allocator.lookup(hashes)
        restored = []
        if self.host is not None:       # hits past the device's from host memory, held until shared below
            hits, restored = self.host.extend_hits(hashes, hits)
        blocks = self.head_cache.share(self, req, hits) if self.engine.drafting else None
        if blocks is None:
            blocks = self.lookahead.share(self, req, hits) if self.engine.drafting else self.share_blocks(hits)
        if self.host is not None:
            self.allocator.free(hits)
            self.host.count_hit(restored, len(blocks), bs)
        req.block_table.blocks = blocks
        req.num_computed = len(blocks) * bs
        self.hashes[req.req_id] = hashes[:len(blocks)]
        self.hits[req.req_id] = req.num_computed
        c = self.counts
        c["requests"] += 1
        c["prompt_tokens"] += len(tokens)
        c["hit_tokens"] += req.num_computed
        c["hit_requests"] += bool(blocks)
        c["recomputed_tokens"] += (len(hits) - len(blocks)) * bs

    def start_state(self, req) -> None:
        """A hybrid target's request that was just given a cleared state slot: after a hit, the slot
        starts from the state after the hit's last block (its checkpoint), not an empty prefix."""
        if self.block_states is not None and req.num_computed:
            last = req.block_table.blocks[req.num_computed // self.block_size - 1]
            self.block_states.restore(self.engine.states.store, req.state_slot, last)

    def share_blocks(self, blocks: list[int]) -> list[int]:
        for b in blocks:
            self.allocator.share(b)
        return list(blocks)

    def recompute_boundary(self, req, blocks: list[int], h: int) -> int:
        """A private copy of `blocks[-1]` (all layers; the hit block that ends at position h - 1) whose
        head row at h - 1 is recomputed from the kept feature f[h - 1] and this prompt's token x[h]; the
        shared block is released. -> the copy."""
        e, al = self.engine, self.allocator
        last = blocks[-1]
        new = al.allocate(1)[0]
        cache = e.cache
        cache.key[:, new].copy_(cache.key[:, last])
        cache.value[:, new].copy_(cache.value[:, last])
        self.boundary_feature[new].copy_(self.boundary_feature[last])
        token = req.tokens[h]
        self.boundary_token[new] = token
        self.boundary_host[new] = token
        if self.block_states is not None:
            self.block_states.copy(last, new)
        table = blocks[:-1] + [new]
        slot = new * self.block_size + self.block_size - 1
        window = Window.from_counts([1], [0], torch.tensor([slot], dtype=torch.long, device=cache.device))
        pol, layer = e.drafter.policy, e.head.layer_index
        pol.begin(window, layers=range(layer, layer + 1), kind="boundary")
        try:
            md = AttentionMetadata.build(cache, pol, [h - 1], [1], [table], [h - 1], attention=e.config.attention,
                                         slot_mapping=window.slot_mapping)
            e.head(torch.tensor([token], dtype=torch.long, device=cache.device), self.boundary_feature[new][None], md)
            pol.commit(None)
        except BaseException:
            pol.cancel()
            raise
        al.free([last])
        self.counts["head_rows_recomputed"] += 1
        self.counts["blocks_copied"] += 1
        return new

    def recompute_head(self, req, hits: list[int]) -> list[int]:
        """Private copies of the hit blocks whose head rows 0 .. h-1 are recomputed (RecomputeHead):
        one target forward over the hit (features only), one head pass. -> the copies."""
        e, al, cache, bs = self.engine, self.allocator, self.engine.cache, self.block_size
        self.share_blocks(hits)                       # held while copied (never evicted for the copies)
        new = al.allocate(len(hits))
        h, layer, dev = len(hits) * bs, e.head.layer_index, cache.device
        positions = list(range(h))
        slots = torch.tensor([new[p // bs] * bs + p % bs for p in positions], dtype=torch.long, device=dev)
        window = Window.from_counts([h], [0], slots)
        hidden = aux = None
        for pol, layers in ((e.policy, range(0, layer)), (e.drafter.policy, range(layer, layer + 1))):
            pol.begin(window, layers=layers, kind="recompute")
            try:
                md = AttentionMetadata.build(cache, pol, positions, [h], [new], [0], attention=e.config.attention,
                                             slot_mapping=slots)
                if hidden is None:                    # the target: the features the head reads
                    ids = torch.tensor(req.tokens[:h], dtype=torch.long, device=dev)
                    hidden, aux = e.target.forward_with_aux(ids, md, e.head.aux_layers)
                else:                                 # the head: row p reads f[p] and this prompt's x[p + 1]
                    feats = e.head.features_from_target(hidden, aux)
                    e.head(torch.tensor(req.tokens[1:h + 1], dtype=torch.long, device=dev), feats, md)
                pol.commit(None)
            except BaseException:
                pol.cancel()
                raise
        for old, b in zip(hits, new):                 # the target's K/V: the cached blocks' own bits
            cache.key[:layer, b].copy_(cache.key[:layer, old])
            cache.value[:layer, b].copy_(cache.value[:layer, old])
        al.free(hits)
        c = self.counts
        c["recomputed_tokens"] += h
        c["head_rows_recomputed"] += h
        c["blocks_copied"] += len(hits)
        return new

    # -- after a window --------------------------------------------------------------------------
    def keep_boundary(self, window, features: torch.Tensor, next_ids: torch.Tensor, commit_mask: torch.Tensor):
        """In the step body, after the head pass: each committed row at a block's last offset keeps
        its feature f[p] [h] and the token its head row read x[p + 1] beside its block (device code,
        no sync; rows that are not committed block ends go to the scratch row)."""
        if self.boundary_feature is None:
            return
        bs, scratch = self.block_size, self.boundary_token.shape[0] - 1
        slots = window.commit_slots               # where each row lands once accepted (a tree's path: n + depth)
        end = (slots >= 0) & (slots.remainder(bs) == bs - 1) & commit_mask.bool()
        idx = torch.where(end, slots // bs, scratch)
        self.boundary_feature.index_copy_(0, idx, features.to(self.boundary_feature.dtype))
        self.boundary_token.index_copy_(0, idx, next_ids.long())

    def commit(self, requests) -> None:
        """Register every request's newly committed full blocks (rows below num_computed), once."""
        bs, al = self.block_size, self.allocator
        for r in requests:
            hashes = self.hashes.setdefault(r.req_id, [])
            if len(hashes) >= r.num_computed // bs:
                continue                # no new full block this step (most steps): the context is not copied
            tokens = r.tokens
            for b in range(len(hashes), r.num_computed // bs):
                h = block_hash(hashes[-1] if hashes else None, tokens[b * bs:(b + 1) * bs])
                hashes.append(h)
                if self.boundary_token is not None:     # what `keep_boundary` wrote on the device: x[p + 1]
                    end = (b + 1) * bs
                    self.boundary_host[r.block_table.blocks[b]] = tokens[end] if end < len(tokens) else -1
                self.counts["registered"] += al.register(r.block_table.blocks[b], h)

    def forget(self, req) -> None:
        self.hashes.pop(req.req_id, None)

    def _on_evict(self, block: int, h: bytes) -> None:
        if self.host is not None:
            self.host.on_evict(block, h)

    def _on_idle(self, block: int) -> None:
        if self.engine.head is not None:
            self.head_cache.on_idle(self.engine, block)

    def stats(self) -> dict:
        """Counters: prompt tokens seen, hit tokens (served from cached blocks), prefill tokens run,
        recomputed tokens (cached, matched, and prefilled again: drop_last's dropped block), head
        rows recomputed and blocks copied (boundary),
        blocks registered and evicted, and the hit rate (hit tokens / prompt tokens)."""
        c = dict(self.counts)
        c["prefill_tokens"] = c["prompt_tokens"] - c["hit_tokens"]
        c["evictions"] = self.allocator.evictions
        c["cached_blocks"] = self.allocator.num_cached
        c["hit_rate"] = c["hit_tokens"] / c["prompt_tokens"] if c["prompt_tokens"] else 0.0
        c["head_cache"], c["lookahead"] = self.config.head_cache, self.config.lookahead
        if self.host is not None:
            c.update(self.host.stats())
        return c
