"""The prefix cache's host tier: cached blocks evicted from the device go to host memory and come
back on a hit (`PrefixCacheConfig(host_blocks=N, offload=...)`; off when host_blocks is 0).

When the caching allocator takes an idle cached block back, its bytes go to a host slot keyed by its
block hash (`kv.host_tier.HostBlockPool`, LRU; a hash the pool holds already is only touched). At
admission, past the device's hits, each next block hash is looked up on the device, then in the
pool; a host hit is copied into a freshly allocated device block, registered again, and shared like
any device hit (the lookahead strategies see one list of hit blocks).

What goes with a block is the offload strategy's (a class in `OFFLOADS`; each declares what it keeps):

- `target_only` (the field's failure kept as a strategy: vLLM's CPU offload with EAGLE switched off,
  SGLang #31600 before #21125): the target's layers only; the head's K/V of a restored block is
  zeros and its boundary row unknown, so the head drafts from a cache that does not match the
  prefix. Tokens stay exact (the target verifies); acceptance after a host hit falls.
- `target_head` (exact): every cache layer (the head's is layer N of the same block) and the
  block's boundary row (`boundary_feature`, `boundary_token`: what its last head row read).
- `target_head_state` (exact, hybrid targets too): `target_head` plus the hybrid target's state
  checkpoints at the block's end (`state.checkpoints.BlockStates`: the recurrent and conv state
  after its last row); a hit restored from the host starts its state slot from the checkpoint that
  came back with its last block. On an attention-only target it carries what `target_head` does.
  The two others are refused with a hybrid target (without the state the tokens change).

Only committed blocks are ever registered, so only committed rows leave (NWOR's rule for what may
leave the device holds by construction). In debug mode (`LabConfig(debug=True)`) every offload keeps
a digest per store and every restore checks the block that came back against it
(`HostTierMismatch`, naming the store). CUDA: see kv.host_tier (own stream, device-side waits;
unverified here, no GPU; tests/gpu/test_gpu_host_tier.py).
"""
from __future__ import annotations

import hashlib

import torch

from nwor_lab.kv.host_tier import BlockCopier, HostBlockPool

OFFLOADS: dict[str, type] = {}


def _register(cls):
    OFFLOADS[cls.name] = cls
    return cls


class HostTierMismatch(RuntimeError):
    """A block that came back from the host tier differs from what left the device (debug check)."""


class Offload:
    """What a block takes to the host. Declares `keeps_head` (the head's K/V layers and the block's
    boundary row), `keeps_state` (a hybrid target's state checkpoint at the block's end) and
    `exact` (a restored block equals the evicted one in every store the engine reads)."""
    name = ""
    keeps_head = False
    keeps_state = False
    exact = True

    def check(self, engine) -> None:
        """Refuse an engine this strategy cannot serve (ValueError): a hybrid target's state is the
        target's own, so a block that comes back without its state checkpoint would change the tokens,
        not only the acceptance."""
        if hasattr(engine.target, "state_spec") and not self.keeps_state:
            raise ValueError(f"prefix_cache host_blocks with a hybrid target (offload={self.name!r}): a restored "
                             f"block needs the recurrent and conv state at its end (its state checkpoint) or "
                             f"the target decodes from the wrong state; use offload='target_head_state'")

    def layers(self, engine) -> int:
        """Cache layers kept, from layer 0 (the target's come first, then the head's)."""
        if self.keeps_head or engine.head is None:
            return engine.cache.spec.num_layers
        return engine.target.num_layers

    def rows(self, caching) -> list[str]:
        """Names of the per-block row stores kept (`HostTier.block_rows`)."""
        rows = caching_rows(caching)
        return [n for n in rows if (self.keeps_state if n.startswith("state.") else self.keeps_head)]


@_register
class TargetOnly(Offload):
    """The target's layers only: the head's K/V and boundary row are dropped (the field's failure)."""
    name = "target_only"
    exact = False


@_register
class TargetHead(Offload):
    """Every cache layer and the block's boundary row: a restored block is the evicted one."""
    name = "target_head"
    keeps_head = True


@_register
class TargetHeadState(TargetHead):
    """`target_head` plus a hybrid target's state checkpoint at the block's end (`state.recurrent`,
    `state.conv`: the rows of `state.checkpoints.BlockStates`): a restored block's hit starts its
    state slot from the checkpoint that came back with it. On an attention-only target it carries
    what `target_head` does."""
    name = "target_head_state"
    keeps_state = True


def caching_rows(caching) -> dict[str, tuple[torch.Tensor, int, float]]:
    """The per-block row stores prefix caching keeps beside its blocks: name -> (device tensor, the
    dimension indexed by block id, the value a row holds when unknown): the boundary lookahead's
    feature and token (`[NB + 1, ...]`), and a hybrid target's state checkpoints at block ends
    (`state.recurrent` `[L, NB + 1, *state_shape]`, `state.conv` `[L, NB + 1, W - 1, C]`, block dim 1)."""
    out = {}
    if caching.boundary_feature is not None:
        out["boundary_feature"] = (caching.boundary_feature, 0, 0.0)
        out["boundary_token"] = (caching.boundary_token, 0, -1)
    states = caching.block_states
    if states is not None:
        out["state.recurrent"] = (states.recurrent, 1, 0.0)
        out["state.conv"] = (states.conv, 1, 0.0)
    return out


def _row(store: tuple[torch.Tensor, int, float], block: int) -> torch.Tensor:
    """`block`'s row of a row store (a view)."""
    t, dim, _ = store
    return t.select(dim, block)


def _digest(t: torch.Tensor) -> str:
    raw = t.contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()
    return hashlib.blake2b(raw, digest_size=8).hexdigest()


class HostTier:
    """The engine's host tier: the pool, the copier, the strategy and the counters (`stats()`)."""

    def __init__(self, caching, host_blocks: int, offload: str):
        engine = caching.engine
        self.caching, self.engine = caching, engine
        self.strategy = OFFLOADS[offload]()
        self.strategy.check(engine)
        cache = engine.cache
        if not isinstance(cache.key, torch.Tensor):
            raise ValueError("prefix_cache host_blocks: the host tier needs the engine's own stacked cache, "
                             "not per-layer views")
        spec = cache.spec
        self.num_layers = self.strategy.layers(engine)
        self.all_rows = caching_rows(caching)
        self.kept_rows = self.strategy.rows(caching)
        self.pool = HostBlockPool(host_blocks, (self.num_layers, spec.block_size, spec.num_kv_heads, spec.head_size),
                                  spec.storage_dtype,
                                  {n: (tuple(_row(self.all_rows[n], 0).shape), self.all_rows[n][0].dtype)
                                   for n in self.kept_rows},
                                  pin=cache.device.type == "cuda", on_drop=self._on_drop)
        self.copier = BlockCopier(cache.device)
        self.debug = engine.config.debug
        self.digests: dict[bytes, dict[str, str]] = {}      # debug: what left, per store
        # the host's copy of each pooled block's boundary token (PrefixCaching.boundary_host follows it back)
        self.boundary_host: dict[bytes, int] = {}
        self.counts = dict(host_offloads=0, host_offload_skips=0, host_offload_refused=0, host_restores=0,
                           host_hit_requests=0, host_hit_tokens=0, host_bytes_offloaded=0, host_bytes_restored=0)

    # -- device -> host -------------------------------------------------------------------------
    def on_evict(self, block: int, h: bytes) -> None:
        """An idle cached block is taken back by the allocator: its kept bytes go to the host."""
        pool = self.pool
        if pool.find(h) is not None:                 # the same bytes are there already (restored before)
            self.counts["host_offload_skips"] += 1
            return
        slot = pool.reserve(h)
        if slot is None:                             # every slot is being restored from right now
            self.counts["host_offload_refused"] += 1
            return
        cache, n = self.engine.cache, self.num_layers
        pairs = [(pool.key[slot], cache.key[:n, block]), (pool.value[slot], cache.value[:n, block])]
        pairs += [(pool.rows[name][slot], _row(self.all_rows[name], block)) for name in self.kept_rows]
        if self.debug:
            self.digests[h] = self._stores(block)
        self.copier.copy(pairs)
        if "boundary_token" in self.kept_rows:
            self.boundary_host[h] = self.caching.boundary_host.get(block, -1)
        self.counts["host_offloads"] += 1
        self.counts["host_bytes_offloaded"] += pool.slot_bytes

    def _on_drop(self, h: bytes) -> None:
        self.digests.pop(h, None)
        self.boundary_host.pop(h, None)

    # -- host -> device -------------------------------------------------------------------------
    def extend_hits(self, hashes: list[bytes], hits: list[int]) -> tuple[list[int], list[int]]:
        """Past the device's leading `hits`, match each next hash on the device or in the pool; copy
        the pool's into fresh device blocks and register them. Every returned block is held once by
        this call (the caller shares what it keeps, then frees them all), so nothing matched is
        evicted while the restore allocates. -> (hit blocks in position order, the indices of those
        restored from the host)."""
        al, pool = self.caching.allocator, self.pool
        entries: list = []
        n_host = 0
        for b in hits:
            al.share(b)
        for h in hashes[len(hits):]:
            b = al.block_of.get(h)
            if b is not None:                          # a later block still on the device
                if b in al.idle and al.num_free - 1 < n_host:
                    break
                al.share(b)
                entries.append(b)
                continue
            slot = pool.find(h)
            if slot is None or al.num_free < n_host + 1:
                break
            entries.append((slot, h))
            n_host += 1
        slots = [e for e in entries if isinstance(e, tuple)]
        if not slots:
            return list(hits) + entries, []
        pool.hold(s for s, _ in slots)
        try:
            new = al.allocate(len(slots))              # may offload other idle blocks (never a held slot)
            self._restore(slots, new)
        finally:
            pool.release(s for s, _ in slots)
        for (_, h), b in zip(slots, new):
            al.register(b, h)
        it = iter(new)
        blocks = list(hits) + [next(it) if isinstance(e, tuple) else e for e in entries]
        restored = [len(hits) + i for i, e in enumerate(entries) if isinstance(e, tuple)]
        self.counts["host_restores"] += len(new)
        self.counts["host_bytes_restored"] += len(new) * pool.slot_bytes
        return blocks, restored

    def _restore(self, slots: list[tuple[int, bytes]], blocks: list[int]) -> None:
        pool, cache, n = self.pool, self.engine.cache, self.num_layers
        pairs, fills = [], []
        for (slot, _), b in zip(slots, blocks):
            pairs += [(cache.key[:n, b], pool.key[slot]), (cache.value[:n, b], pool.value[slot])]
            pairs += [(_row(self.all_rows[name], b), pool.rows[name][slot]) for name in self.kept_rows]
            if n < cache.spec.num_layers:              # dropped layers: zeros, not a stale holder's rows
                fills += [(cache.key[n:, b], 0.0), (cache.value[n:, b], 0.0)]
            fills += [(_row(store, b), store[2]) for name, store in self.all_rows.items() if name not in self.kept_rows]
        self.copier.copy(pairs, fills)
        if self.caching.boundary_token is not None:     # kept: the token that left; dropped: unknown (-1)
            for (_, h), b in zip(slots, blocks):
                self.caching.boundary_host[b] = self.boundary_host.get(h, -1)
        if self.debug:
            for (slot, h), b in zip(slots, blocks):
                self.check_restored(h, b)

    def check_restored(self, h: bytes, block: int) -> None:
        """Debug: `block` (just restored for hash `h`) holds, in every kept store, the bytes that left."""
        want = self.digests.get(h)
        if want is None:
            return
        got = self._stores(block)
        for store, digest in want.items():
            if got[store] != digest:
                raise HostTierMismatch(f"host tier (offload={self.strategy.name!r}): block hash {h.hex()[:16]} came "
                                       f"back into device block {block} different from what left, in store "
                                       f"{store!r} (digest {got[store]} != {digest})")

    def _stores(self, block: int) -> dict[str, str]:
        """Digests of the kept stores of device `block` (syncs: debug only)."""
        cache, n, nt = self.engine.cache, self.num_layers, self.engine.target.num_layers
        out = {"target layers": _digest(torch.stack([cache.key[:nt, block], cache.value[:nt, block]]))}
        if n > nt:
            out["head layers"] = _digest(torch.stack([cache.key[nt:n, block], cache.value[nt:n, block]]))
        for name in self.kept_rows:
            out[name] = _digest(_row(self.all_rows[name], block))
        return out

    def count_hit(self, restored: list[int], kept: int, block_size: int) -> None:
        """A request kept its first `kept` hit blocks; those at indices `restored` came from the host."""
        n = sum(i < kept for i in restored)
        self.counts["host_hit_requests"] += bool(n)
        self.counts["host_hit_tokens"] += n * block_size

    def stats(self) -> dict:
        """Counters: blocks offloaded (and skipped: already on the host; refused: every slot busy),
        restored, requests and tokens served from the host, bytes each way, pool use."""
        c = dict(self.counts)
        c["host_blocks"], c["host_blocks_used"] = self.pool.num_slots, len(self.pool)
        c["host_dropped"] = self.pool.dropped
        c["offload"] = self.strategy.name
        return c
