"""The prefix cache's blocks: chained block hashes and an allocator that keeps committed blocks.

A block is keyed by a chained hash, `block_hash(parent_hash, token ids of the block)` (vLLM's and
SGLang's key): the hash of block b names the whole prefix `tokens[0 : (b + 1) * BS]`, so two
requests share block b only if every token before its end agrees. blake2b over the parent's
digest and the ids as little-endian int64 (not Python's `hash`, which is salted per process):
the same prefix hashes alike in every process and run.

    hashes = chain_hashes(prompt, BS)             # one per FULL block of the prompt
    hits = allocator.lookup(hashes)               # the leading registered blocks
    for b in hits: allocator.share(b)             # refcount + 1, out of the LRU list
    allocator.register(block, h)                  # a committed block, once (False if h or block known)
    allocator.free(blocks)                        # refcount - 1; a registered block at 0 waits, LRU

What may be registered is the caller's rule (a *committed* block: every row holds an accepted
token's K/V, `nwor_lab.engine.prefix`); this module only keeps what it is handed. A registered
block is never handed out for writing while registered: `allocate` takes free blocks first, then
evicts the least recently released unreferenced registered block (its hash forgotten first).
"""
from __future__ import annotations

import hashlib
from array import array
from collections import Counter, OrderedDict
from typing import Callable, Sequence

from nwor_lab.kv.blocks import BlockAllocator

__all__ = ["block_hash", "chain_hashes", "CachingAllocator"]

_ROOT = b"nwor-lab prefix root"


def block_hash(parent: bytes | None, tokens: Sequence[int]) -> bytes:
    """16-byte blake2b of the parent block's hash (None: the first block) and the block's token ids."""
    h = hashlib.blake2b(digest_size=16)
    h.update(_ROOT if parent is None else parent)
    ids = array("q", [int(t) for t in tokens])
    if ids.itemsize != 8:                       # pragma: no cover - array('q') is 8 bytes everywhere we run
        raise RuntimeError("array('q') is not 8 bytes here: block hashes would differ across machines")
    if array("q", [1]).tobytes()[0] != 1:
        ids.byteswap()                          # little-endian on every host
    h.update(ids.tobytes())
    return h.digest()


def chain_hashes(tokens: Sequence[int], block_size: int, parent: bytes | None = None) -> list[bytes]:
    """The chained hash of every full block of `tokens` (a partial last block has none)."""
    out = []
    for b in range(len(tokens) // block_size):
        parent = block_hash(parent, tokens[b * block_size:(b + 1) * block_size])
        out.append(parent)
    return out


class CachingAllocator(BlockAllocator):
    """A BlockAllocator whose blocks may outlive their request: reference-counted, registered by
    hash, and kept after their last holder frees them until the allocator needs the block.

    - `refs[b]`: holders of block b (every allocated block has >= 1; a registered idle block none);
    - `idle`: registered blocks nobody holds, least recently released first (evicted first). A
      request frees its blocks last-first, so its tail leaves before its head (vLLM's order).
    - `num_free` counts idle blocks: they are free space that happens to remember something.
    `on_idle(block)` is called when a registered block's last holder frees it, `on_evict(block, h)`
    when an idle block is taken back (its hash `h` already forgotten, its bytes not yet overwritten:
    a host tier copies them out here).
    """

    def __init__(self, num_blocks: int, on_evict: Callable[[int, bytes], None] | None = None,
                 on_idle: Callable[[int], None] | None = None):
        super().__init__(num_blocks)
        self.refs: dict[int, int] = {}
        self.block_of: dict[bytes, int] = {}
        self.hash_of: dict[int, bytes] = {}
        self.idle: OrderedDict[int, None] = OrderedDict()
        self.on_evict, self.on_idle = on_evict, on_idle
        self.evictions = 0

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self.idle)

    @property
    def num_cached(self) -> int:
        """Registered blocks (held or idle)."""
        return len(self.hash_of)

    def _take(self) -> int:
        """A never-registered free block first; else the least recently released idle one, evicted."""
        if self._free:
            b = super()._take()
        else:
            b, _ = self.idle.popitem(last=False)
            h = self._forget(b)
            self.evictions += 1
            if self.on_evict is not None:
                self.on_evict(b, h)
        self.refs[b] = 1
        return b

    def _free_detail(self) -> str:
        return f" ({len(self.idle)} of them cached)"

    def free(self, blocks) -> None:
        blocks = list(blocks)
        for b, n in Counter(blocks).items():
            if self.refs.get(b, 0) < n:
                raise ValueError(f"block {b} is not held {n} times (double free?)")
        for b in reversed(blocks):              # the tail first: evicted before the head
            self.refs[b] -= 1
            if self.refs[b]:
                continue
            del self.refs[b]
            if b in self.hash_of:
                self.idle[b] = None
                if self.on_idle is not None:
                    self.on_idle(b)
            else:
                self._used.remove(b)
                self._free.append(b)

    def share(self, block: int) -> None:
        """One more holder of a registered block (a prefix hit); an idle one leaves the LRU list."""
        if block not in self.hash_of:
            raise ValueError(f"block {block} is not registered: only cached blocks are shared")
        if block in self.idle:
            del self.idle[block]
            self.refs[block] = 1
        else:
            self.refs[block] += 1

    def register(self, block: int, h: bytes) -> bool:
        """Key a held, committed `block` by its chained hash `h`. -> False (nothing changes) when `h`
        names another block already (the same prefix computed twice: the first copy stays the
        cache's) or `block` is registered already; a block is never registered twice."""
        if block not in self.refs:
            raise ValueError(f"block {block} is not held: register a block while its request holds it")
        if h in self.block_of or block in self.hash_of:
            return False
        self.block_of[h] = block
        self.hash_of[block] = h
        return True

    def lookup(self, hashes: Sequence[bytes]) -> list[int]:
        """The registered blocks of the leading `hashes` (stops at the first miss)."""
        out = []
        for h in hashes:
            b = self.block_of.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def _forget(self, block: int) -> bytes:
        h = self.hash_of.pop(block)
        del self.block_of[h]
        return h
