"""Which slots hold a rejected row, and in which cache layers (an engine observer on the prefill side).

A window's rows that were not committed reach the cache only under a policy that does not declare
`preserves_rejected_slots` (write-all: `off`); there they stay until a committed row overwrites the
slot. `RejectedRows.slots` maps such a slot to its cache layers; `export_request` names each
shipped row that holds one (a shipped block holding a rejected row: the auditor's finding).
"""
from __future__ import annotations


class RejectedRows:
    def __init__(self):
        self.slots: dict[int, set[int]] = {}

    def on_phase(self, event) -> None:
        if event.phase != "commit" or event.acceptance is None:
            return
        slots = event.window.slot_mapping.tolist()
        kept = event.acceptance.commit_mask.tolist()
        layers = set(event.layers)
        for slot, keep in zip(slots, kept):
            if slot < 0:
                continue
            if keep:
                left = self.slots.get(slot, set()) - layers
                if left:
                    self.slots[slot] = left
                else:
                    self.slots.pop(slot, None)
            elif not event.policy.preserves_rejected_slots:
                self.slots.setdefault(slot, set()).update(layers)
