"""`cow`: checkpoint the state before the window, advance the live state through every row, and on a
rejection restore the checkpoint and re-advance over the accepted rows (llama.cpp's checkpoints).

llama.cpp re-decodes the accepted tokens through the whole model; here the re-advance recomputes
only the recurrence and the conv from the layer inputs the window kept, which gives the same state
(the accepted rows' inputs do not depend on the rejected ones: the model is causal)."""
from __future__ import annotations

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
        # the checkpoint: each speculative group's committed rows, in every opened layer
        self._saved = {}
        for grp in self.groups:
            if grp.speculative:
                for layer in self.layers:
                    self._saved[layer, grp] = [self._state_in(layer, grp), self._conv_in(layer, grp), None, None]

    def _state_out(self, layer, grp, kept, inputs, options):
        self._write_live(layer, grp, state=kept[:, -1])
        if grp.speculative:
            self._saved[layer, grp][2] = (inputs, options)

    def _conv_out(self, layer, grp, history):
        self._write_live(layer, grp, conv=self._conv_after(history, grp.last_row))
        if grp.speculative:
            self._saved[layer, grp][3] = history[:, self.spec.conv_width - 1:]

    def _commit(self, accepted):
        # Eagerly, a group whose drafts were all accepted keeps its live state (llama.cpp's win: no
        # restore); while capturing a CUDA graph the acceptance is not known on the host, so every
        # group restores and re-advances (masked: bit-identical to the live state when all passed).
        self._note_kept(sum(t.nbytes for state, conv, (inputs, _), x in self._saved.values()
                            for t in (state, conv, *inputs, x)))
        for (layer, grp), (state, conv, (inputs, options), x) in self._saved.items():
            a = accepted[grp.reqs]
            if not capturing() and bool((a == grp.drafts).all()):
                continue
            state, conv = self._readvance(state, conv, inputs, x, grp.first_candidate + a, options)
            self._write_live(layer, grp, state=state, conv=conv)
        self._saved = {}

    def _cancel(self, drafts):
        """The live state already holds every row: drop the checkpoint."""
        self._saved = {}
