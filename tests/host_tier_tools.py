"""Helpers for the host-tier tests: damage what the tier copied out, so the debug check must name it."""
from __future__ import annotations

from typing import Callable


def corrupt_on_evict(damage: Callable[[object, int], None]):
    """An engine hook (`hook(engine)`, run once the engine is built): after the host tier copies an
    evicted block out, `damage(pool, slot)` changes that host copy in place."""
    def hook(e):
        tier = e.prefix.host
        evict = tier.on_evict

        def on_evict(block, h):
            evict(block, h)
            slot = tier.pool.slot_of.get(h)
            if slot is not None:
                damage(tier.pool, slot)
        tier.on_evict = on_evict
    return hook
