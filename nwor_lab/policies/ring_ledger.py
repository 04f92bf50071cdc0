"""Debug mode on sliding-window caches: which position each slot holds, and every read checked.

A `RingLedger` is a window observer (nwor_lab.policies.observer) that keeps, per layer and slot,
the position whose K/V the slot holds (-1: none), from what each policy declares:

    write    a policy that writes the cache (not `window_in_buffer`): the rows' slots now hold
             the rows' positions (a ring slot's older position is evicted)
    commit   `window_in_buffer`: the kept rows' slots take their positions; else, when
             `preserves_rejected_slots`, the rejected rows' slots hold again what they held at begin
    cancel   a buffered window flushes the rows it received, as `off` would have

Attention calls `check_reads(layer, md)` after each layer's write: every position a query reads
from the cache (not from cow's log, not from a staging buffer) must sit in a slot that holds that
position. A write-all window on a ring of W slots fails exactly here, and `RingCorruption` says
where: the layer, the request, the position read, the slot and what overwrote it.

It needs the windows' positions (`Window.positions`, set by the engine). Host work per read:
debug only.
"""
from __future__ import annotations

import torch

from nwor_lab.kv.blocks import build_slot_mapping


class RingCorruption(AssertionError):
    """A query read a cache slot that no longer holds the position it reads it as."""

    def __init__(self, *, layer: int, request: int, query_position: int, position: int, slot: int,
                 ring_index: int | None, holder: int, by_this_window: bool, ring_slots: int | None,
                 sliding_window: int | None, policy: str, kind: str):
        self.layer, self.request, self.query_position, self.position = layer, request, query_position, position
        self.slot, self.ring_index, self.holder, self.by_this_window = slot, ring_index, holder, by_this_window
        self.ring_slots, self.sliding_window, self.policy, self.kind = ring_slots, sliding_window, policy, kind
        self.step: int | None = None         # set by the engine: which step, which request id
        self.req_id: int | None = None
        super().__init__(self.describe())

    def describe(self) -> str:
        where = f"step {self.step}, " if self.step is not None else ""
        who = f"request {self.req_id}" if self.req_id is not None else f"request {self.request} of the window"
        what = "this window's own write" if self.by_this_window else "a rejected draft an earlier window left"
        held = f"position {self.holder}" if self.holder >= 0 else "nothing"
        ring = f" (ring index {self.ring_index} of {self.ring_slots})" if self.ring_index is not None else ""
        return (f"ring corruption ({where}{who}, layer {self.layer}, {self.kind or 'a'} window, nwor={self.policy}): "
                f"the query at position {self.query_position} attends to position {self.position}, but its slot "
                f"{self.slot}{ring} holds {held}, written by {what}; position {self.position} was evicted while "
                f"the sliding window of {self.sliding_window} still needs it. Give the ring slack (kv_ring='slack': "
                f"W + k slots) or keep rejected K/V out of it (nwor_mode='stage' or 'cow')")

    def __str__(self) -> str:
        return self.describe()


class RingLedger:
    """Which position each slot of each layer holds (`holder [L, NB*BS]` int64, host), kept from the
    policies' phases; `check_reads` raises `RingCorruption` at the first wrong read."""

    def __init__(self, cache, sliding):
        self.cache, self.sliding = cache, sliding
        self.holder = torch.full((cache.num_layers, cache.num_slots), -1, dtype=torch.long)
        self._window = None          # the open window's (slots, positions) on the host
        self._old = None             # holder of the window's slots at begin, [layers, T]
        self._buffered: dict[int, list[range]] = {}

    # -- observer --------------------------------------------------------------------------------
    def on_phase(self, e) -> None:
        if e.phase == "begin":
            if e.window.positions is None:
                self._window = None      # a window without positions (hand-built): nothing to track
                return
            slots, pos = e.window.slot_mapping.cpu(), e.window.positions.cpu()
            self._window = (slots, pos, e.layers)
            self._old = self.holder[e.layers.start:e.layers.stop][:, slots.clamp(min=0)].clone()
            self._buffered = {}
            return
        if self._window is None:
            return
        slots, pos, layers = self._window
        if e.phase == "write":
            if e.policy.window_in_buffer:
                self._buffered.setdefault(e.layer, []).append(e.rows)
            else:
                self._put([e.layer], slots[e.rows.start:e.rows.stop], pos[e.rows.start:e.rows.stop])
        elif e.phase == "commit":
            mask = e.acceptance.commit_mask.cpu()
            if e.policy.window_in_buffer:
                self._put(sorted(self._buffered), slots[mask], pos[mask])
            elif e.policy.preserves_rejected_slots:
                rejected = ~mask & (slots >= 0)
                self.holder[layers.start:layers.stop, slots[rejected]] = self._old[:, rejected]
            self._window = None
        elif e.phase == "cancel":
            for layer, ranges in self._buffered.items():
                for rows in ranges:
                    self._put([layer], slots[rows.start:rows.stop], pos[rows.start:rows.stop])
            self._window = None

    def _put(self, layers, slots, positions) -> None:
        real = slots >= 0
        for layer in layers:
            self.holder[layer, slots[real]] = positions[real]

    # -- the check ---------------------------------------------------------------------------------
    def check_reads(self, layer: int, md) -> None:
        """Every position request r of `md` reads from the cache (its first query's window start ..
        `md.kernel.cache_lens[r]`, less its log range) must be what its slot holds in `layer`."""
        ring = self.sliding.ring_slots
        a = md.kernel                   # the metadata's device form, read once on the host (debug mode)
        tables, cache_lens, qsl = a.block_tables.cpu(), a.cache_lens.tolist(), a.query_start_loc.tolist()
        logs = (a.log_lo.tolist(), a.log_start.tolist()) if a.log_lo is not None else None
        window_positions = set(self._window[1].tolist()) if self._window is not None else set()
        pos_host = md.positions.cpu()
        writes = md.slot_mapping.cpu()
        for r, hi in enumerate(cache_lens):
            qs, qe = qsl[r], qsl[r + 1]
            # a request that writes nowhere is padding (a step's padding rows, a chain row of a
            # request that finished or drafts no further): its output is never used
            if qs == qe or bool((writes[qs:qe] < 0).all()):
                continue
            lo = min(hi, self.sliding.first_key(int(pos_host[qs])))   # its first query's window on
            if hi <= lo:
                continue
            wanted = torch.arange(lo, hi)
            slots = build_slot_mapping(tables[r:r + 1], torch.zeros(hi - lo, dtype=torch.long), wanted,
                                       self.cache.spec.block_size, ring)
            ok = self.holder[layer, slots] == wanted
            if logs is not None:
                first, n = logs[0][r], logs[1][r + 1] - logs[1][r]
                ok |= (wanted >= first) & (wanted < first + n)          # served from the log
            if bool(ok.all()):
                continue
            i = int((~ok).nonzero()[0])
            p, slot, held = int(wanted[i]), int(slots[i]), int(self.holder[layer, slots[i]])
            raise RingCorruption(layer=layer, request=r, query_position=int(pos_host[qs]),
                                 position=p, slot=slot, ring_index=None if ring is None else p % ring,
                                 holder=held, by_this_window=held in window_positions, ring_slots=ring,
                                 sliding_window=self.sliding.size, policy=getattr(md.writer, "name", "?"),
                                 kind=getattr(md.writer, "kind", ""))

    def ring_of(self, layer: int, blocks: list[int]) -> list[int]:
        """The position each ring index of a request (its `blocks`) holds in `layer` (-1: none)."""
        bs, ring = self.cache.spec.block_size, self.sliding.ring_slots
        idx = torch.arange(ring)
        slots = torch.tensor(blocks)[idx // bs] * bs + idx % bs
        return self.holder[layer, slots].tolist()
