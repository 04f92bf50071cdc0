"""`cow`: checkpoint the state before the window, advance the live state through every row, and on a
rejection restore the checkpoint and re-advance over the accepted rows (llama.cpp's checkpoints).

llama.cpp re-decodes the accepted tokens through the whole model; here the re-advance recomputes
only the recurrence and the conv from the layer inputs the window kept, which gives the same state
(the accepted rows' inputs do not depend on the rejected ones: the model is causal)."""
from __future__ import annotations

import torch

from nwor_lab._checks import capturing
from nwor_lab.state.policy import StatePolicy


class CowState(StatePolicy):
    advances_live = True
    checkpoints = True
    keeps_window_inputs = True

    @classmethod
    def transient_bytes_per_request(cls, k, spec):
        return spec.row_bytes + (k + 1) * spec.token_input_bytes

    def _begin(self):
        # the checkpoint: each speculative request's committed row, in every opened layer
        self._saved = {}
        for r, seg in enumerate(self.segments):
            if seg.drafts:
                for layer in self.layers:
                    self._saved[layer, r] = [self._state_in(layer, r).clone(), self._conv_in(layer, r).clone(),
                                             None, None]
        self._note_kept(sum(s.nbytes + c.nbytes for s, c, _, _ in self._saved.values()))

    def _state_out(self, layer, r, kept, inputs, scale):
        self._write_live(layer, r, state=kept[-1])
        if self.segments[r].drafts:
            self._saved[layer, r][2] = (inputs, scale)

    def _conv_out(self, layer, r, history):
        self._write_live(layer, r, conv=history[-(self.spec.conv_width - 1):])
        if self.segments[r].drafts:
            self._saved[layer, r][3] = history[self.spec.conv_width - 1:]

    def _commit(self, accepted):
        # Eagerly, a request whose drafts were all accepted keeps its live state (llama.cpp's win:
        # no restore); while capturing a CUDA graph the acceptance is not known on the host, so every
        # request restores and re-advances (masked: bit-identical to the live state when all passed).
        skip = None if capturing() else (accepted == self._drafts()).tolist()
        for (layer, r), (state, conv, (inputs, scale), x) in self._saved.items():
            if skip is not None and skip[r]:
                continue
            seg = self.segments[r]
            # restore, then re-advance over t_last .. d_a
            state, conv = self._readvance(state, conv, inputs, x, seg.first_candidate + accepted[r], scale)
            self._write_live(layer, r, state=state, conv=conv)
        self._saved = {}

    def _drafts(self):
        return torch.tensor([seg.drafts for seg in self.segments], device=self.store.device)

    def _cancel(self):
        self._saved = {}
