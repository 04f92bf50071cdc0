"""Per-rank observers for tensor-parallel runs: a cache audit, and a fault to inject.

`ShardAudit` (an engine observer) checks this rank's cache shard around every window: no slot
outside the window changes; where the policy preserves rejected slots (`cow`, `stage`), every
rejected slot is bit-identical to before the window, in every layer; and it counts the rows each
cache layer received and kept (`rows_written`, `rows_committed`), so a test can see the draft
head's layer written and committed on every rank. `FaultInjector` makes one rank fail after a
given verify window (raise, die with os._exit, or hang), to test that a failed rank ends the run.
Both are picklable: `nwor_lab.distributed.generate` sends them to every rank.
"""
from __future__ import annotations

import os
import time

import torch


class ShardAudit:
    def __init__(self):
        self.windows = 0
        self.rejected_checked = 0
        self.rows_written: dict[int, int] = {}       # cache layer -> rows written (every window)
        self.rows_committed: dict[int, int] = {}     # cache layer -> rows kept by commits
        self._before = None
        self._layers: set[int] = set()

    def on_phase(self, event) -> None:
        if event.phase == "begin":
            self._before = event.policy.cache.snapshot()
            self._layers = set()
        elif event.phase == "write":
            self._layers.add(event.layer)
            self.rows_written[event.layer] = self.rows_written.get(event.layer, 0) + len(event.rows)
        elif event.phase == "commit":
            self._check(event)

    def _check(self, event) -> None:
        cache, w, acc = event.policy.cache, event.window, event.acceptance
        before_k, before_v = self._before
        changed = ((cache.key != before_k).flatten(3).any(-1) | (cache.value != before_v).flatten(3).any(-1))
        changed = changed.flatten(1, 2)                                       # [L, slots]
        slots = w.slot_mapping.long()
        real = slots >= 0
        in_window = torch.zeros(changed.shape[1], dtype=torch.bool, device=changed.device)
        in_window[slots[real]] = True
        if changed[:, ~in_window].any():
            raise AssertionError(f"{event.policy.name} {event.kind} window: a slot outside the window changed")
        rejected = slots[real & ~acc.commit_mask]
        if event.policy.preserves_rejected_slots and rejected.numel():
            if changed[:, rejected].any():
                raise AssertionError(f"{event.policy.name} {event.kind} window: a rejected slot changed "
                                     f"(the policy declares preserves_rejected_slots)")
            self.rejected_checked += int(rejected.numel()) * len(self._layers)
        kept = int((real & acc.commit_mask).sum())
        for layer in self._layers:
            self.rows_committed[layer] = self.rows_committed.get(layer, 0) + kept
        self.windows += 1
        self._before = None

    def summary(self) -> dict:
        return {"windows": self.windows, "rejected_slot_layers_checked": self.rejected_checked,
                "rows_written": dict(sorted(self.rows_written.items())),
                "rows_committed": dict(sorted(self.rows_committed.items()))}


class FaultInjector:
    """Make rank `rank` fail once it has finished verify window `after_window` (0-based): `how` is
    "raise" (a RuntimeError), "exit" (os._exit(3), no report: as a killed process) or "hang" (sleep
    for an hour: its peers wait in their next collective until the collective timeout)."""

    def __init__(self, rank: int = 1, after_window: int = 1, how: str = "raise"):
        if how not in ("raise", "exit", "hang"):
            raise ValueError(f"how={how!r}: choose raise, exit or hang")
        self.rank, self.after_window, self.how = rank, after_window, how

    def on_phase(self, event) -> None:
        pass

    def on_window_end(self, engine, entry, window) -> None:
        group = getattr(engine, "tp_group", None)
        if group is None or group.rank != self.rank or entry.kind != "verify" or entry.step != self.after_window:
            return
        if self.how == "exit":
            os._exit(3)
        if self.how == "hang":
            time.sleep(3600)
        raise RuntimeError(f"injected failure on rank {self.rank} after verify window {self.after_window}")
