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

    def _state_out(self, layer, grp, kept, inputs, options):
        # row j holds the state after candidate j (t_last, d_1, ...); the committed row was read
        # (gathered into a copy) before these writes, so overwriting it is safe, as in vLLM's kernel
        snaps = self._candidate_states(grp, kept)                          # [G, n, H, K, V]
        self.store.recurrent[layer, :, :snaps.shape[1]].index_copy_(0, self.slots[grp.reqs], snaps)
        self.stats["bytes_copied"] += snaps.nbytes

    def _conv_out(self, layer, grp, history):
        W, n, dev = self.spec.conv_width, grp.candidates(), history.device
        # candidate j's conv state: history[first_candidate + 1 + j : ... + W - 1]
        fc = torch.as_tensor(grp.first_candidate, device=dev).reshape(-1, 1, 1)
        idx = (fc + 1 + torch.arange(n, device=dev)[:, None] + torch.arange(W - 1, device=dev)).clamp(
            0, history.shape[1] - 1).expand(grp.count, -1, -1)
        snaps = history[torch.arange(grp.count, device=dev)[:, None, None], idx]   # [G, n, W-1, C]
        self.store.conv[layer, :, :n].index_copy_(0, self.slots[grp.reqs], snaps.to(self.store.conv.dtype))
        self.stats["bytes_copied"] += snaps.nbytes

    def _commit(self, accepted):
        # the accepted position's row becomes the committed one: no state moves
        self.store.current.index_copy_(0, self.slots, accepted)
