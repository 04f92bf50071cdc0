"""Block allocation, per-request block tables and the slot mapping.

A request's token at position `p` lives in block `table[p // block_size]` at offset
`p % block_size`, i.e. slot `table[p // BS] * BS + p % BS`. Drafts need their slots before they
are verified, so `BlockTable.ensure` takes a lookahead: allocate for `num_tokens + lookahead`.

A ring (`ring_slots=S`, sliding-window caches, `nwor_lab.kv.ring`) maps position `p` to ring index
`p mod S` first: slot `table[(p mod S) // BS] * BS + (p mod S) % BS`; the table never holds more
than `ceil(S / BS)` blocks.
"""
from __future__ import annotations

import torch


class NoFreeBlocksError(RuntimeError):
    """The allocator ran out of blocks; the caller must preempt or wait."""


class BlockAllocator:
    """A free list over `num_blocks` physical blocks (lowest ids first, deterministic)."""

    def __init__(self, num_blocks: int):
        if num_blocks <= 0:
            raise ValueError(f"num_blocks={num_blocks}: must be > 0")
        self.num_blocks = num_blocks
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        """`n` blocks, all or none: NoFreeBlocksError when fewer than `n` are free."""
        if n < 0:
            raise ValueError(f"n={n}: cannot allocate a negative number of blocks")
        if n > self.num_free:
            raise NoFreeBlocksError(f"asked for {n} blocks, {self.num_free} of {self.num_blocks} "
                                    f"free{self._free_detail()}; make the cache bigger (num_blocks) or run "
                                    f"fewer requests")
        return [self._take() for _ in range(n)]

    def _take(self) -> int:
        """One free block, now in use (a subclass may take it from elsewhere: an evicted cached one)."""
        b = self._free.pop()
        self._used.add(b)
        return b

    def _free_detail(self) -> str:
        """What the out-of-blocks message adds about the free blocks."""
        return ""

    def free(self, blocks) -> None:
        for b in blocks:
            if b not in self._used:
                raise ValueError(f"block {b} is not allocated (double free?)")
            self._used.remove(b)
            self._free.append(b)


class BlockTable:
    """The blocks of one request, in position order (ring order when `ring_slots` is set)."""

    def __init__(self, allocator: BlockAllocator, block_size: int, ring_slots: int | None = None):
        self.allocator = allocator
        self.block_size = block_size
        self.ring_slots = ring_slots
        self.blocks: list[int] = []

    @property
    def capacity(self) -> int:
        """Tokens that fit in the blocks held now."""
        return len(self.blocks) * self.block_size

    @property
    def max_blocks(self) -> int | None:
        """Blocks a ring holds at most (None: no ring, the table grows with the positions)."""
        return None if self.ring_slots is None else -(-self.ring_slots // self.block_size)

    def ensure(self, num_tokens: int, lookahead: int = 0) -> None:
        """Hold enough blocks for positions `0 .. num_tokens + lookahead - 1` (a ring: at most its own)."""
        need = -(-(num_tokens + lookahead) // self.block_size)
        if self.ring_slots is not None:
            need = min(need, self.max_blocks)
        need -= len(self.blocks)
        if need > 0:
            self.blocks.extend(self.allocator.allocate(need))

    def slots(self, positions) -> list[int]:
        """Slot ids of `positions` (ints); raises if a position has no block yet."""
        out = []
        for p in positions:
            i = p if self.ring_slots is None or p < 0 else p % self.ring_slots
            idx = i // self.block_size
            if p < 0 or idx >= len(self.blocks):
                raise IndexError(f"position {p} has no block (capacity {self.capacity}); "
                                 f"call ensure(num_tokens, lookahead) first")
            out.append(self.blocks[idx] * self.block_size + i % self.block_size)
        return out

    def release(self) -> None:
        self.allocator.free(self.blocks)
        self.blocks = []


def slot_to_block_offset(slots, block_size: int):
    """slot -> (block, offset within the block): `slot = block * block_size + offset`. Works on ints
    and index tensors alike (padding slots -1 must be filtered out first)."""
    return slots // block_size, slots % block_size


def block_table_tensor(tables, device=None) -> torch.Tensor:
    """Per-request block lists -> `[R, max_blocks]` int64, short rows padded with -1."""
    width = max((len(t) for t in tables), default=0)
    out = torch.full((len(tables), max(width, 1)), -1, dtype=torch.long)
    for r, table in enumerate(tables):
        out[r, :len(table)] = torch.as_tensor(list(table), dtype=torch.long)
    return out.to(device) if device is not None else out


def build_slot_mapping(block_tables: torch.Tensor, token_req: torch.Tensor, positions: torch.Tensor,
                       block_size: int, ring_slots: int | None = None) -> torch.Tensor:
    """Vectorised slot mapping, as the model runner builds it on the device.

    block_tables: `[R, max_blocks]` int (unused entries may be anything, e.g. -1)
    token_req:    `[T]` request index of each token
    positions:    `[T]` position of each token in its request; -1 = padding token
    ring_slots:   S for a ring cache (position p at ring index p mod S), None for a linear one
    returns       `[T]` int64 slots, -1 for padding

    The bounds check reads the largest block index on the host: it is skipped while a CUDA graph
    is being captured (the graphed engine allocates every block before a replay).
    """
    positions = positions.long()
    index = positions if ring_slots is None else positions.remainder(ring_slots)   # padding fixed below
    block_idx = (index // block_size).clamp(min=0)
    # (nwor_lab._checks.capturing, which sits above kv in the layering)
    capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    if positions.numel() and not capturing and int(block_idx.max()) >= block_tables.shape[1]:
        raise IndexError(f"positions: {int(positions.max())} needs block {int(block_idx.max())} but "
                         f"block_tables has {block_tables.shape[1]} columns; allocate first")
    blocks = block_tables.long()[token_req.long(), block_idx]
    slots = blocks * block_size + index % block_size
    return torch.where(positions >= 0, slots, torch.full_like(slots, -1))
