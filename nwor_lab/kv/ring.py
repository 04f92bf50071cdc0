"""Sliding-window attention over ring caches: which positions a query reads, where they live, and
which positions a window's writes evict.

    W = size         a query at position q attends keys q - W + 1 .. q
    S = ring_slots   each request keeps its last S positions of every layer: position p lives at
                     ring index p mod S (block table[(p mod S) // BS], offset (p mod S) % BS);
                     None: no ring, every position keeps its own slot (the whole context)

Writing position P into a ring evicts position P - S (if P >= S). A verify window holds t_last at
n and drafts at n + 1 .. n + k; its query at n needs n - W + 1 onward, so a window written before
attention (write-all) evicts a position its own queries still need as soon as n + j - S >= n - W + 1
for a draft j, i.e. unless S >= W + k (llama.cpp's slack), or unless the window's K/V stay out of the
ring until commit (`stage`), or the evicted rows are read from a log (`cow`).

Every function here is plain arithmetic on ints; the slot mapping itself stays in
`nwor_lab.kv.blocks.build_slot_mapping` (the one place slots are built), which takes `ring_slots`.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SlidingWindow:
    """What a sliding-window cache keeps, for one engine (every request and layer alike).

    size:       W, the attention window in positions (>= 1)
    ring_slots: S, slots per request and layer (>= W), or None: no ring (the whole context)
    guard:      cut each window's drafts to what cannot evict a position still needed
                (`drafts_allowed`): mlx-lm's answer, speculation stops once the ring has wrapped
    """

    size: int
    ring_slots: int | None = None
    guard: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"sliding_window={self.size!r}: give W as an int >= 1")
        if self.ring_slots is not None and (not isinstance(self.ring_slots, int) or self.ring_slots < self.size):
            raise ValueError(f"ring_slots={self.ring_slots!r}: a ring must hold at least the window's "
                             f"W={self.size} positions (or None: no ring)")

    def first_key(self, query_position: int) -> int:
        """The lowest position a query at `query_position` attends to."""
        return max(0, query_position - self.size + 1)

    def drafts_allowed(self, start: int, k: int) -> int:
        """Drafts a window with t_last at position `start` may verify without its writes evicting a
        position one of its queries needs: all k without a ring or without the guard; else draft j
        (at start + j) is safe if its slot never held a position (start + j < S) or the position it
        evicts (start + j - S) lies below the window of the query at start (j <= S - W)."""
        if self.ring_slots is None or not self.guard:
            return k
        return min(k, max(self.ring_slots - self.size, self.ring_slots - 1 - start))


def evicted_needed(ring_slots: int, sliding_window: int, start: int, num_tokens: int) -> list[tuple[int, int]]:
    """(ring index, position) of every entry that writing positions `start .. start + num_tokens - 1`
    into a ring of `ring_slots` evicts while a query of those positions still needs it (the query
    at `start` needs `start - W + 1` onward), in position order. What a write-all window loses.
    Assumes num_tokens <= ring_slots (a window never wraps onto itself)."""
    out = []
    for p in range(start, start + num_tokens):
        old = p - ring_slots
        if old >= 0 and old >= start - sliding_window + 1:
            out.append((p % ring_slots, old))
    return out
