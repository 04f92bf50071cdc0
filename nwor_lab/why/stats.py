"""Per-block statistics over block contents: what rejected K/V does to them.

Two ways a system can compute a statistic of a KV block (a per-block fp8 scale `amax / 448`, an
eviction score):
- over the block's bytes when it needs them (`block_amax`): it sees whatever the slots hold then,
  rejected K/V past a request's end included;
- as K/V arrive (`WriteTimeAmax`, a window observer): it sees every row that reached the cache,
  also rows a later token overwrites or a CoW restore takes back. Only a policy that never writes
  a rejected row into the cache (stage) keeps such a statistic to kept tokens.

Shapes: `L` layers, `NB` blocks, `BS` block size; statistics are float32 `[L, blocks]`.
"""
from __future__ import annotations

import torch

__all__ = ["WriteTimeAmax", "block_amax", "FP8_E4M3_MAX"]

FP8_E4M3_MAX = 448.0   # the largest finite float8_e4m3fn: a per-block scale is amax / 448


def block_amax(key: torch.Tensor) -> torch.Tensor:
    """`[L, nb]` max |K| over every slot of each block, from K `[L, nb, BS, H, D]`."""
    return key.float().abs().flatten(2).amax(-1)


class WriteTimeAmax:
    """A window observer keeping, per layer and block, the max |K| of everything that reached the
    cache: after each phase that can write (a layer's write, the commit, a cancel) it reads the
    window's slots of the layers concerned and folds them in. (Reading the slots rather than the
    rows handed to the policy is what makes it see the cache: a stage write leaves them as they
    were, its commit brings the kept rows.)

    `amax`: `[L, NB]` float32; `per_block(blocks)` -> `[L, len(blocks)]`."""

    def __init__(self, cache):
        self.cache = cache
        self.amax = torch.zeros(cache.num_layers, cache.spec.num_blocks, dtype=torch.float32)

    def attach(self, target) -> "WriteTimeAmax":
        """Observe a write policy or an engine (anything with an `observers` list)."""
        target.observers.append(self)
        return self

    def on_phase(self, event) -> None:
        if event.phase == "write":
            layers = [event.layer]
        elif event.phase in ("commit", "cancel"):
            layers = list(event.layers)
        else:
            return
        slots = event.window.slot_mapping
        slots = slots[slots >= 0].long()
        if not slots.numel():
            return
        bs = self.cache.spec.block_size
        block = (slots // bs).cpu()
        for layer in layers:
            key, _ = self.cache.layer(layer)
            rows = key[slots // bs, slots % bs].float().abs().flatten(1).amax(-1).cpu()   # [n] per slot
            self.amax[layer].scatter_reduce_(0, block, rows, reduce="amax")

    def per_block(self, blocks) -> torch.Tensor:
        return self.amax[:, torch.as_tensor(list(blocks), dtype=torch.long)]
