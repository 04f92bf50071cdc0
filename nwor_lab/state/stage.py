"""`stage`: the states after t_last, d_1 .. d_k are transient (one buffer per window, as SGLang's
`intermediate_states_buffer`); commit writes only the accepted position's state, and the conv state
it keeps is a slice of the window's conv history. The store only ever receives accepted state
(NWOR), holds one row per request, and commit is one copy per layer and request."""
from __future__ import annotations

import torch

from nwor_lab.state.policy import StatePolicy


class StageState(StatePolicy):
    keeps_window_states = True

    @classmethod
    def transient_bytes_per_request(cls, k, spec):
        return (k + 1) * spec.num_layers * spec.state_bytes_layer \
            + (spec.conv_width - 1 + k + 1) * spec.num_layers * spec.conv_dim * spec.dtype.itemsize

    def _begin(self):
        self._states, self._histories = {}, {}

    def _state_out(self, layer, r, kept, inputs, scale):
        self._states[layer, r] = kept

    def _conv_out(self, layer, r, history):
        seg = self.segments[r]
        # what any candidate's conv state can need: W-1 rows before t_last's, to the end
        self._histories[layer, r] = history[seg.first_candidate + 1:]

    def _pick(self, accepted):
        """accepted `[R]` (device): candidate a of each request commits (a = its accepted drafts)."""
        kept = sum(t.nbytes for t in (*self._states.values(), *self._histories.values()))
        self._note_kept(kept)
        for (layer, r), states in self._states.items():
            j = accepted[r:r + 1]
            # history starts at t_last's row + 1, so candidate j's conv state begins at row j
            self._write_live(layer, r, state=states.index_select(0, j)[0],
                             conv=self._conv_after(self._histories[layer, r], j - 1))
        self._states, self._histories = {}, {}

    def _commit(self, accepted):
        self._pick(accepted)

    def _cancel(self):
        self._pick(torch.tensor([seg.drafts for seg in self.segments], device=self.store.device))
