"""Content hashes of paged-cache blocks: what a system sees that hashes, deduplicates, snapshots or
ships KV blocks by their bytes.

A block's digest covers the raw bytes of its K and V in every chosen layer, in the logical order
`[BS, H, D]` (so NHD and HND caches of the same contents hash alike), every slot of the block
included: a consumer that handles whole blocks (a content hash, a snapshot, a transfer of the
block to another worker or to host memory) sees the slots past a request's last token too.

    block_digest(cache, block)                 -> "3f2a9c01d4e5b6a7" (16 hex digits, blake2b)
    block_digests(cache, blocks, layers=[0])   -> one digest per block
"""
from __future__ import annotations

import hashlib
from typing import Iterable, Sequence

import torch

__all__ = ["block_bytes", "block_digest", "block_digests"]


def block_bytes(cache, block: int, layers: Sequence[int] | None = None) -> bytes:
    """The raw bytes of `block`'s K then V, layer after layer (`layers`: default all)."""
    layers = range(cache.num_layers) if layers is None else layers
    parts = []
    for layer in layers:
        key, value = cache.layer(layer)
        for t in (key[block], value[block]):        # [BS, H, D], logical order whatever the layout
            parts.append(t.contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return b"".join(parts)


def block_digest(cache, block: int, layers: Sequence[int] | None = None, digits: int = 16) -> str:
    """`digits` hex digits of the blake2b hash of `block_bytes(cache, block, layers)`."""
    h = hashlib.blake2b(block_bytes(cache, block, layers), digest_size=max(1, (digits + 1) // 2))
    return h.hexdigest()[:digits]


def block_digests(cache, blocks: Iterable[int], layers: Sequence[int] | None = None, digits: int = 16) -> list[str]:
    """`block_digest` of each of `blocks`, in order."""
    return [block_digest(cache, int(b), layers, digits) for b in blocks]
