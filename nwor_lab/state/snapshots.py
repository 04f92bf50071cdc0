"""`snapshots`: one state row per window position, kept in the store; commit only moves the slot's
`current` row to the accepted position's (vLLM's Mamba / gated-DeltaNet spec decode: the state of
position `num_accepted - 1` is read next). Nothing is copied at commit, but every request holds
k + 1 rows for as long as it lives."""
from __future__ import annotations

import torch

from nwor_lab.state.policy import StatePolicy


class SnapshotsState(StatePolicy):
    keeps_window_states = True

    @classmethod
    def rows_per_slot(cls, k: int) -> int:
        return k + 1

    def _state_out(self, layer, r, kept, inputs, scale):
        # row j holds the state after candidate j (t_last, d_1, ...); the committed row was read
        # (cloned) before these writes, so overwriting it is safe, as in vLLM's kernel
        slot = self.segments[r].slot
        self.store.recurrent[layer, slot, :kept.shape[0]].copy_(kept)
        self.stats["bytes_copied"] += kept.nbytes

    def _conv_out(self, layer, r, history):
        seg = self.segments[r]
        for j in range(seg.drafts + 1):
            self.store.conv[layer, seg.slot, j].copy_(self._conv_after(history, seg.first_candidate + j))
        self.stats["bytes_copied"] += (seg.drafts + 1) * self.spec.conv_bytes_layer

    def _commit(self, accepted):
        # the accepted position's row becomes the committed one: no state moves
        self.store.current.index_copy_(0, self._slots(), accepted)

    def _cancel(self):
        drafts = torch.tensor([seg.drafts for seg in self.segments], device=self.store.device)
        self.store.current.index_copy_(0, self._slots(), drafts)

    def _slots(self):
        return torch.tensor([seg.slot for seg in self.segments], device=self.store.device)
