"""Prefix caching's strategies for the draft head (`nwor_lab.engine.prefix` runs them): each a class
in a registry, its name what `PrefixCacheConfig` and `LabConfig.prefix_cache` accept.

The draft head's cache is a store of its own, and its rows need more than their block's tokens:
the head's row at position p reads the target's feature f[p] and the NEXT token x[p + 1]
(model/eagle.py). So the head's row at the last position of a hit (the *boundary* row) read the
token that followed in the request that registered the block, which a new prompt may not share.
Two families of strategies, each a class in a registry (names from the registry):

- `HEAD_CACHES` (what the head's K/V of a hit holds): `cached` (it rides in layer N of the target's
  block: exact), `missing` (the field's failure, SGLang #31600: the head's rows of a cached block
  are dropped when no request holds it, so a later hit reads zeros; tokens stay exact, the target
  verifies, acceptance falls), `recompute` (private copies of the hit blocks, the head's rows
  recomputed from a target forward over the hit: exact, costs the forward; refused on hybrids).
- `LOOKAHEADS` (the boundary row): `drop_last` (vLLM #53670: the last hit block is dropped and
  prefilled again, every hit recomputes a block) and `boundary` (exact at target-only's hit rate:
  the feature f[p] at each committed block's last row and the token its head row read are kept
  beside the block, written in the step body for committed rows only; on a hit whose next prompt
  token differs, the last hit block is copied to a private block and only the head's boundary row
  is recomputed there, one head row, no target row).
"""
from __future__ import annotations

import torch

HEAD_CACHES: dict[str, type] = {}
LOOKAHEADS: dict[str, type] = {}


def _register(table: dict):
    def add(cls):
        table[cls.name] = cls
        return cls
    return add


# -- the head's cache -------------------------------------------------------------------------------
class HeadCache:
    """What the head's K/V of a hit prefix holds. Declares `exact` (the head's rows of a hit equal
    what decoding the prefix wrote) and acts when a registered block goes idle (nobody holds it)."""
    name = ""
    exact = True

    def check(self, engine) -> None:
        """Refuse an engine this strategy cannot serve (ValueError)."""

    def on_idle(self, engine, block: int) -> None:
        """A registered block's last holder left (it stays cached, evictable)."""

    def share(self, caching: "nwor_lab.engine.prefix.PrefixCaching", req, hits: list[int]) -> list[int] | None:
        """The blocks `req` starts with when this strategy decides (None: the lookahead decides)."""
        return None


@_register(HEAD_CACHES)
class CachedHead(HeadCache):
    """The head's K/V is layer N of the same stacked cache: it rides with the target's block."""
    name = "cached"


@_register(HEAD_CACHES)
class MissingHead(HeadCache):
    """The field's failure kept as a strategy (SGLang #31600: the draft model's K/V is not kept with
    the target's): once no request holds a cached block, its head rows are gone (zeroed here), so a
    hit reads a head cache that does not match the prefix. Tokens stay the target's; acceptance drops."""
    name = "missing"
    exact = False

    def on_idle(self, engine, block: int) -> None:
        layer = engine.head.layer_index
        key, value = engine.cache.layer(layer)
        key[block].zero_()
        value[block].zero_()


@_register(HEAD_CACHES)
class RecomputeHead(HeadCache):
    """Recompute the head's K/V of the hit: the request gets private copies of its hit blocks, a
    target forward over the hit prefix gives the features the head reads (its own K/V writes land in
    those private copies only and are then replaced by the cached blocks' target layers, bit for bit),
    and the head's rows 0 .. h-1 are written there from them and this prompt's next tokens (its
    boundary row included, so no lookahead strategy is needed). What a hit saves is then the target's
    K/V and nothing else: every hit token is a recomputed token, and the hit blocks are not shared
    (the head's K/V lives in layer N of the same stacked block). Refused on a hybrid target (the
    forward would advance its recurrent state)."""
    name = "recompute"

    def check(self, engine) -> None:
        if engine.states is not None:
            raise ValueError("prefix_cache head_cache='recompute' with a hybrid target: the target forward over "
                             "the hit would advance the recurrent state; use head_cache='cached'")

    def share(self, caching, req, hits):
        return caching.recompute_head(req, hits) if hits else []


# -- the lookahead ----------------------------------------------------------------------------------
class Lookahead:
    """How the head's boundary row of a hit is made right. Declares `keeps_boundary` (the step keeps
    each committed block's last feature and next token) and `drops_blocks` (hit blocks given up per hit)."""
    name = ""
    keeps_boundary = False
    drops_blocks = 0

    def share(self, caching: "nwor_lab.engine.prefix.PrefixCaching", req, hits: list[int]) -> list[int]:
        """The blocks `req` starts with, out of the prompt's `hits` (nothing shared yet)."""
        raise NotImplementedError


@_register(LOOKAHEADS)
class DropLast(Lookahead):
    """vLLM's choice (#53670): drop the last hit block and prefill it again, so the head's row at
    the boundary is computed from a fresh target feature and this prompt's next token."""
    name = "drop_last"
    drops_blocks = 1

    def share(self, caching, req, hits):
        return caching.share_blocks(hits[:-1])


@_register(LOOKAHEADS)
class KeepBoundary(Lookahead):
    """Exact at target-only's hit rate: the feature and next token at each committed block's last row
    are kept beside the block. A hit block whose kept next token is this prompt's next token is exact as
    it is; any other gets a private copy with the head's boundary row recomputed there (one head row from
    the kept feature; costs a block copy and hidden-size floats kept per cached block). Every hit block
    is checked, not only the last: a middle hit block may have been registered by a request that went on
    differently (its successor block, with this prompt's tokens, registered by a third one)."""
    name = "boundary"
    keeps_boundary = True

    def share(self, caching, req, hits):
        if not hits:
            return []
        bs = caching.block_size
        blocks = caching.share_blocks(hits)
        kept = [caching.boundary_host.get(b, -1) for b in blocks]      # the host's copy: no device read
        if caching.boundary_token.device.type == "cpu":
            # free on the CPU: every CPU run checks the host copy against the device store it stands for
            stored = caching.boundary_token[torch.tensor(blocks)].tolist()
            if stored != kept:
                raise RuntimeError(f"prefix cache: the host copy of the boundary tokens {kept} differs from the "
                                   f"store's {stored} for blocks {blocks} (a write path that skips boundary_host)")
        for i in range(len(blocks)):
            h = (i + 1) * bs
            if kept[i] != req.tokens[h]:
                blocks[i] = caching.recompute_boundary(req, blocks[:i + 1], h)
        return blocks
