"""A host tier for cached blocks: a bounded pool of host memory keyed by block hash, LRU, and the
copies between it and the device cache.

    pool = HostBlockPool(num_slots, (L, BS, H, D), dtype, rows={"boundary_token": ((), torch.long)}, pin=cuda)
    slot = pool.reserve(h)           # a slot for hash h; the least recently used unheld one is dropped when full
    slot = pool.find(h)              # its slot (and most recently used now), or None
    copier = BlockCopier(device)
    copier.copy([(pool.key[slot], cache.key[:L, block]), ...])     # device -> host, or host -> device

A slot is slot-major (`pool.key[slot]` is one contiguous `[L, BS, H, D]` piece), so a device -> host
copy lands in pinned memory as it is (a strided host destination would make torch stage through
pageable memory and synchronise). What the pool holds and why is the caller's (nwor_lab.engine.offload):
it only keeps bytes under hashes.

On CUDA the copies run on the copier's own stream: it waits for the work the current stream has
enqueued (the block's last writes), copies, and the current stream then waits for the copies before
its next kernel (both device-side waits: no host sync). The copy does not overlap the step's compute
(the step must not write a block before its bytes left, nor read a restored one before they
arrived); it overlaps the host's scheduling. Unverified here: this was written on a machine without
a GPU (tests/gpu/test_gpu_host_tier.py checks it on one).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Iterable, Sequence

import torch

__all__ = ["HostBlockPool", "BlockCopier"]


class HostBlockPool:
    """`num_slots` host slots of one block each: `key`, `value` `[S, *block_shape]` and, per named
    row store, `rows[name]` `[S, *row_shape]`; pinned when `pin` (a CUDA device's pool).

    `slot_of` maps hash -> slot, least recently used first. `held` slots are never dropped (a restore
    reading them while its own allocation offloads other blocks). `on_drop(h)` is called when a
    hash's slot is taken for another."""

    def __init__(self, num_slots: int, block_shape: Sequence[int], dtype: torch.dtype,
                 rows: dict[str, tuple[Sequence[int], torch.dtype]] | None = None, pin: bool = False,
                 on_drop: Callable[[bytes], None] | None = None):
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots <= 0:
            raise ValueError(f"num_slots={num_slots!r}: the host pool needs a positive number of block slots")
        shape = (num_slots, *block_shape)
        self.key = torch.zeros(shape, dtype=dtype, pin_memory=pin)
        self.value = torch.zeros(shape, dtype=dtype, pin_memory=pin)
        self.rows = {name: torch.zeros((num_slots, *rshape), dtype=rdtype, pin_memory=pin)
                     for name, (rshape, rdtype) in (rows or {}).items()}
        self.num_slots = num_slots
        self.slot_of: OrderedDict[bytes, int] = OrderedDict()
        self._free = list(range(num_slots - 1, -1, -1))
        self.held: set[int] = set()
        self.on_drop = on_drop
        self.dropped = 0

    @property
    def slot_bytes(self) -> int:
        """Bytes one slot holds (K, V and every row store)."""
        return (self.key[0].nbytes + self.value[0].nbytes
                + sum(t[0].nbytes for t in self.rows.values()))

    def __contains__(self, h: bytes) -> bool:
        return h in self.slot_of

    def __len__(self) -> int:
        return len(self.slot_of)

    def find(self, h: bytes) -> int | None:
        """The slot holding `h` (now the most recently used), or None."""
        slot = self.slot_of.get(h)
        if slot is not None:
            self.slot_of.move_to_end(h)
        return slot

    def reserve(self, h: bytes) -> int | None:
        """A slot for `h` (not held yet): a free one, else the least recently used unheld one (its
        hash dropped). None when every slot is held."""
        if h in self.slot_of:
            raise ValueError("reserve: the hash is in the pool already; find() it instead (caller bug)")
        if self._free:
            slot = self._free.pop()
        else:
            old = next((g for g, s in self.slot_of.items() if s not in self.held), None)
            if old is None:
                return None
            slot = self.slot_of.pop(old)
            self.dropped += 1
            if self.on_drop is not None:
                self.on_drop(old)
        self.slot_of[h] = slot
        return slot

    def hold(self, slots: Iterable[int]) -> None:
        self.held.update(slots)

    def release(self, slots: Iterable[int]) -> None:
        self.held.difference_update(slots)


class BlockCopier:
    """Copies between device blocks and host slots, in order: plain on CPU; on CUDA on a stream of
    its own, fenced against the current stream on both sides (see the module docstring)."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def copy(self, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]],
             fills: Sequence[tuple[torch.Tensor, float]] = ()) -> None:
        """`dst.copy_(src)` for each (dst, src) pair, then `t.fill_(value)` for each fill."""
        if self.stream is None:
            for dst, src in pairs:
                dst.copy_(src)
            for t, value in fills:
                t.fill_(value)
            return
        main = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(main)              # after the block's last writes (device-side wait)
        with torch.cuda.stream(self.stream):
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)  # host sides are pinned, contiguous slots
            for t, value in fills:
                t.fill_(value)
        main.wait_stream(self.stream)              # the step's next kernel after the copies (no host sync)
