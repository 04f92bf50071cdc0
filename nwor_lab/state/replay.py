"""`replay`: the window runs from the committed state without writing it; its layer inputs are kept,
and commit recomputes the state over the accepted rows only (ReplaySSM in vLLM, TensorRT-LLM). A
rollback costs nothing; every commit costs a recurrence over the accepted rows."""
from __future__ import annotations

import torch

from nwor_lab.state.policy import StatePolicy


class ReplayState(StatePolicy):
    keeps_window_inputs = True

    @classmethod
    def transient_bytes_per_request(cls, k, spec):
        return (k + 1) * spec.token_input_bytes

    def _begin(self):
        self._inputs = {}

    def _state_out(self, layer, r, kept, inputs, scale):
        if self.segments[r].drafts == 0:          # nothing to roll back: write as off does
            self._write_live(layer, r, state=kept[-1])
        else:
            self._inputs.setdefault((layer, r), [None, None])[0] = (inputs, scale)

    def _conv_out(self, layer, r, history):
        if self.segments[r].drafts == 0:
            self._write_live(layer, r, conv=history[-(self.spec.conv_width - 1):])
        else:
            self._inputs.setdefault((layer, r), [None, None])[1] = history[self.spec.conv_width - 1:]

    def _replay(self, accepted):
        """Recompute each speculative request from its committed state over t_last, d_1 .. d_a
        (the rows after are masked to identity: one fixed-shape run, no host sync)."""
        kept = sum(t.nbytes for (inputs, _), x in self._inputs.values() for t in (*inputs, x))
        self._note_kept(kept)
        for (layer, r), ((inputs, scale), x) in self._inputs.items():
            seg = self.segments[r]
            state, conv = self._state_in(layer, r), self._conv_in(layer, r)
            state, conv = self._readvance(state, conv, inputs, x, seg.first_candidate + accepted[r], scale)
            self._write_live(layer, r, state=state, conv=conv)
        self._inputs = {}

    def _commit(self, accepted):
        self._replay(accepted)

    def _cancel(self):
        self._replay(torch.tensor([seg.drafts for seg in self.segments], device=self.store.device))
